// Just enough of CUDA to run a rendered kernel source on the CPU, for tests on machines without a GPU: a
// block's threads are fibers on one OS thread (each started by ucontext, then switched by _setjmp/_longjmp,
// which skip the signal-mask system calls of swapcontext), run one block at a time (so __shared__ arrays
// are statics); __syncthreads and a warp's shuffle are barriers at which a fiber yields until all the
// threads it waits for arrive; the 16-bit types convert with round-to-nearest-even as the device does.
// `name<<<grid, block, smem, stream>>>(args)` is rewritten by the test into
// `emu::launch(name, grid, block, smem, stream, args)`. For small problems only.
#pragma once
#include <setjmp.h>
#include <ucontext.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static

struct dim3_ {
    unsigned x = 0, y = 0, z = 0;
};
inline dim3_ blockIdx, blockDim, gridDim;
namespace emu {
inline dim3_ fiber_tid[1024];
inline int current = 0;
}  // namespace emu
#define threadIdx (emu::fiber_tid[emu::current])

struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) float4 { float x, y, z, w; };
struct alignas(8) float2 { float x, y; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }

inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
inline int __clz(const int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }  // leading zeros
inline unsigned __umulhi(const unsigned a, const unsigned b) {  // the high 32 bits of the product
    return static_cast<unsigned>(static_cast<unsigned long long>(a) * b >> 32);
}
// Byte i of the result is byte (s >> 4i) & 7 of the eight bytes y:x.
inline unsigned __byte_perm(const unsigned x, const unsigned y, const unsigned s) {
    const unsigned long long both = (static_cast<unsigned long long>(y) << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((both >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
    return r;
}
// The fast intrinsics at the CUDA documentation's word: __expf exact here (the device's is within a few
// ulp); __fdividef(x, y) is 0 for 2^126 < |y| < 2^128, otherwise x / y.
inline float __expf(const float x) { return std::exp(x); }
inline float __fdividef(const float x, const float y) {
    const float a = std::fabs(y);
    return a > 0x1p126f && a < INFINITY ? 0.0f : x / y;
}
template <class T> T __ldg(const T* p) { return *p; }
inline int min(const int a, const int b) { return a < b ? a : b; }  // CUDA's integer min
template <class T> T __ldcs(const T* p) { return *p; }
template <class T> void __stcs(T* p, const T v) { *p = v; }

struct __nv_bfloat16 { unsigned short x; };
struct __half { unsigned short x; };
inline float __bfloat162float(const __nv_bfloat16 h) { return __uint_as_float(static_cast<unsigned>(h.x) << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(const float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<unsigned short>((u >> 16) | 0x40u)};  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return {static_cast<unsigned short>(u >> 16)};
}
inline float __half2float(const __half h) {
    const int sign = h.x >> 15, exp = (h.x >> 10) & 0x1f, man = h.x & 0x3ff;
    float v;
    if (exp == 0) {
        v = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal
    } else if (exp == 31) {
        v = man ? NAN : INFINITY;
    } else {
        v = std::ldexp(static_cast<float>(man | 0x400), exp - 25);
    }
    return sign ? -v : v;
}
inline __half __float2half_rn(const float f) {  // round to nearest even, as cvt.rn.f16.f32
    const unsigned short sign = std::signbit(f) ? 0x8000 : 0;
    const double a = std::fabs(static_cast<double>(f));
    if (std::isnan(f)) return {0x7fff};
    int e;
    std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
    if (a == 0.0 || e - 1 < -14) {  // subnormal: steps of 2^-24
        const double m = std::nearbyint(a * 16777216.0);
        return {static_cast<unsigned short>(sign | static_cast<unsigned short>(m))};  // 1024 is the least normal
    }
    double m = std::nearbyint(std::ldexp(a, 11 - e));  // 11 significant bits
    if (m == 2048.0) m = 1024.0, ++e;
    const int biased = e - 1 + 15;
    if (biased >= 31) return {static_cast<unsigned short>(sign | 0x7c00)};
    return {static_cast<unsigned short>(sign | (biased << 10) | (static_cast<int>(m) - 1024))};
}

typedef void* cudaStream_t;
enum cudaError_t {
    cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorInvalidConfiguration = 9, cudaErrorMisalignedAddress = 716
};
namespace emu {
inline cudaError_t last_error = cudaSuccess;  // a launch the device would refuse (its grid or block), until read
}  // namespace emu
inline cudaError_t cudaGetLastError() {
    const cudaError_t e = emu::last_error;
    emu::last_error = cudaSuccess;
    return e;
}
// A small GPU for the persistent walks: 2 SMs of 1 resident block, so that each block walks several items.
enum cudaDeviceAttr { cudaDevAttrMultiProcessorCount = 16 };
inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
inline cudaError_t cudaDeviceGetAttribute(int* v, cudaDeviceAttr, int) { *v = 2; return cudaSuccess; }
template <class F>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, F, int, size_t) { *n = 1; return cudaSuccess; }

namespace emu {
constexpr size_t STACK = 256 * 1024;
inline std::vector<ucontext_t> fibers;
inline std::vector<std::unique_ptr<char[]>> stacks;
struct Jump {
    jmp_buf at;
};
inline std::vector<Jump> fiber_jump;
inline jmp_buf scheduler_jump;
inline std::function<void()> body;
inline bool fiber_finished = false;
inline unsigned exchange[1024];

inline void yield() {
    if (!_setjmp(fiber_jump[current].at)) _longjmp(scheduler_jump, 1);
}

// A barrier of `expected` fibers: each arrives, then yields back to the scheduler until the last one has.
struct Barrier {
    int expected = 0, arrived = 0;
    long long generation = 0;
    void wait() {
        const long long mine = generation;
        if (++arrived == expected) {
            arrived = 0;
            ++generation;
            return;
        }
        while (generation == mine) yield();
    }
};
inline Barrier block_barrier;
inline std::vector<Barrier> warp_barriers;

inline void fiber_main() {
    body();
    fiber_finished = true;
    _longjmp(scheduler_jump, 1);
}

inline unsigned long long launches = 0;  // launches so far: with the block's index, which block of which launch runs

// This launch's and block's number, unique over the program: emulated state kept per block resets when it changes.
inline unsigned long long block_serial() { return launches << 32 | (blockIdx.x + gridDim.x * blockIdx.y); }

// cp.async as the device may run it, for a template whose host branch calls these (emu::cp_async, cp_async_commit,
// cp_async_wait) instead of copying at once, and for the tensor-core partials' CPU stand-ins (tests/cuda_on_cpu.py): a copy lands only when a wait_group of the thread that issued it
// retires its group, and until then its destination holds 0xff bytes (NaN in every float type), so a read that
// comes before its wait reads NaN. A copy still in flight when its thread returns fails the launch.
struct AsyncCopy {
    void* dst;
    const void* src;  // nullptr: zeros (a source size of 0)
    int bytes;
    long long group;  // the number of groups its thread had committed when it was issued
};
inline std::vector<AsyncCopy> async_copies[1024];
inline long long async_groups[1024];
inline void cp_async(void* dst, const void* src, const int bytes) {
    std::memset(dst, 0xff, static_cast<size_t>(bytes));
    async_copies[current].push_back({dst, src, bytes, async_groups[current]});
}
inline void cp_async_commit() { ++async_groups[current]; }
// cp.async.wait_group `pending`: every copy of a committed group older than the newest `pending` lands.
inline void cp_async_wait(const int pending) {
    std::vector<AsyncCopy> left;
    for (const AsyncCopy& c : async_copies[current]) {
        if (c.group < async_groups[current] - pending) {
            if (c.src) std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes));
            else std::memset(c.dst, 0, static_cast<size_t>(c.bytes));
        } else {
            left.push_back(c);
        }
    }
    async_copies[current].swap(left);
}

// The generation of the block barrier a fiber waits at (-1: none): greedy scheduling skips such a fiber.
inline long long block_wait_gen[1024];
inline bool blocked_at_block_barrier(const int t) {
    return block_wait_gen[t] >= 0 && block_wait_gen[t] == block_barrier.generation;
}

// EMU_GREEDY_WARPS set: each warp in turn (the last first or the first first, alternating) runs until every lane
// of it waits at __syncthreads or has returned, before the next warp runs at all; warps are then as far apart as
// the block's barriers allow, so a missing barrier between one warp's reads of shared memory and another's writes
// (cp.async's NaN included) shows in the output, whichever of the two warps writes. Unset: round robin, every
// warp one warp barrier on a pass.
inline const bool greedy_warps = std::getenv("EMU_GREEDY_WARPS") != nullptr;

// EMU_DRY_LAUNCH set: launches are checked against the device's limits and counted, and no block runs, so that a
// launch function can be called with the sizes of a GPU problem (and buffers of a few bytes) to learn whether it
// takes the call.
inline const bool dry_launches = std::getenv("EMU_DRY_LAUNCH") != nullptr;

// Runs every block of the grid in order (x first, as the GPU dispatches them), each as `block` fibers
// switched at their barriers. A grid or block the device refuses (an empty one, grid.x past 2^31 - 1, grid.y or
// grid.z past 65535, a block of more than 1024 threads) runs nothing and leaves cudaErrorInvalidConfiguration for
// cudaGetLastError, as the device does.
template <class F, class... A>
void launch(F kernel, const dim3_ grid, const int block, int, void*, A... args) {
    if (grid.x < 1 || grid.y < 1 || grid.z < 1 || grid.x > 0x7fffffffu || grid.y > 65535u || grid.z > 65535u ||
        block < 1 || block > 1024) {
        last_error = cudaErrorInvalidConfiguration;
        return;
    }
    ++launches;
    if (dry_launches) return;
    gridDim = grid;
    blockDim = {static_cast<unsigned>(block), 1, 1};
    block_barrier = Barrier{block};
    warp_barriers.assign((block + 31) / 32, Barrier{32});
    fibers.assign(block, ucontext_t{});
    fiber_jump.resize(block);
    while (static_cast<int>(stacks.size()) < block) stacks.emplace_back(new char[STACK]);
    body = [=] { kernel(args...); };
    for (unsigned g = 0; g < grid.x * grid.y; ++g) {
        blockIdx = {g % grid.x, g / grid.x, 0};
        std::vector<char> state(block, 0);  // 0 not started, 1 running, 2 done
        for (int t = 0; t < block; ++t) {
            fiber_tid[t] = {static_cast<unsigned>(t), 0, 0};
            getcontext(&fibers[t]);
            fibers[t].uc_stack.ss_sp = stacks[t].get();
            fibers[t].uc_stack.ss_size = STACK;
            fibers[t].uc_link = nullptr;
            makecontext(&fibers[t], fiber_main, 0);
        }
        for (int t = 0; t < block; ++t) {
            block_wait_gen[t] = -1;
            async_copies[t].clear();
            async_groups[t] = 0;
        }
        int left = block;
        // One slice of fiber t: it runs until it waits at a barrier or ends.
        auto slice = [&](const int t) {
            current = t;
            if (!_setjmp(scheduler_jump)) {
                if (state[t] == 0) {
                    state[t] = 1;
                    setcontext(&fibers[t]);
                }
                _longjmp(fiber_jump[t].at, 1);
            }
            if (fiber_finished) {
                fiber_finished = false;
                state[t] = 2;
                --left;
                if (!async_copies[t].empty()) {
                    std::fprintf(stderr, "emu: thread %d of block %u returned with %zu cp.async copies in flight\n", t,
                                 blockIdx.x + gridDim.x * blockIdx.y, async_copies[t].size());
                    std::exit(4);
                }
            }
        };
        while (left > 0) {
            if (!greedy_warps) {  // round robin until every fiber has returned
                for (int t = 0; t < block; ++t) {
                    if (state[t] != 2) slice(t);
                }
                continue;
            }
            // Which warp leads flips with each barrier and from block to block, so that over two blocks every
            // stretch between barriers runs both with the last warp first and with the first warp first.
            const int warps = (block + 31) / 32;
            const bool last_first = ((g + block_barrier.generation) & 1) == 0;
            for (int i = 0; i < warps; ++i) {
                const int w = last_first ? warps - 1 - i : i;
                for (bool ran = true; ran;) {
                    ran = false;
                    for (int t = 32 * w; t < block && t < 32 * w + 32; ++t) {
                        if (state[t] == 2 || blocked_at_block_barrier(t)) continue;
                        slice(t);
                        ran = true;
                    }
                }
            }
        }
    }
}

template <class F, class... A>
void launch(F kernel, const unsigned grid, const int block, int shared, void* stream, A... args) {
    launch(kernel, dim3_{grid, 1, 1}, block, shared, stream, args...);
}
}  // namespace emu

inline dim3_ dim3(const unsigned x, const unsigned y = 1, const unsigned z = 1) { return {x, y, z}; }

inline void __syncthreads() {
    emu::block_wait_gen[threadIdx.x] = emu::block_barrier.generation;
    emu::block_barrier.wait();
    emu::block_wait_gen[threadIdx.x] = -1;
}

inline void __syncwarp(unsigned = 0xffffffffu) { emu::warp_barriers[threadIdx.x / 32].wait(); }

// Lane `from(lane)` of the warp's values of v (a lane out of range gets its own, as on the device).
template <class V, class F>
V shfl_from(const V v, F from) {
    static_assert(sizeof(V) == 4, "32-bit lanes");
    const unsigned t = threadIdx.x, w = t / 32;
    std::memcpy(&emu::exchange[t], &v, 4);
    emu::warp_barriers[w].wait();
    const int src = from(static_cast<int>(t % 32));
    V r;
    std::memcpy(&r, &emu::exchange[w * 32 + (src >= 0 && src < 32 ? src : static_cast<int>(t % 32))], 4);
    emu::warp_barriers[w].wait();
    return r;
}
template <class V>
V __shfl_up_sync(unsigned, const V v, const unsigned d) {
    return shfl_from(v, [d](int l) { return l - static_cast<int>(d); });
}
template <class V>
V __shfl_down_sync(unsigned, const V v, const unsigned d) {
    return shfl_from(v, [d](int l) { return l + static_cast<int>(d); });
}

template <class V>
V __shfl_sync(unsigned, const V v, const int src) {  // the device takes the source lane modulo the warp
    return shfl_from(v, [src](int) { return src & 31; });
}

template <class V>
V __shfl_xor_sync(unsigned, const V v, const int mask) {
    return shfl_from(v, [mask](int l) { return l ^ mask; });
}
