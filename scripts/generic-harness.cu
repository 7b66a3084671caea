// Times one rendering of the generic kernels (scripts/render-generic.py) on the bench's untuned-signature rows, both
// directions, without building the frozen module, and prints a hash of each output, so that renderings meant to agree
// bitwise (a change of speed, not of sums) can be compared. Built per rendering with -I that folder:
//     nvcc -O3 -arch=sm_90 -I renders/new -o /tmp/h_new scripts/generic-harness.cu  (the search's NVCC_FLAGS too)
// (gpu-session.sh's `renders` step). Inputs stay in L2 between launches, so the ratios to cudaMemcpy are not the
// bench's ratios to copy_: compare renderings with each other, in one process.
#include <cuda_runtime.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "src_fwd_f16.cu"
#include "src_fwd_bf16.cu"
#include "src_fwd_f32.cu"
#include "src_bwd_f16.cu"
#include "src_bwd_bf16.cu"
#include "src_bwd_f32.cu"

namespace {
using Backward = int (*)(const void*, const void*, const void*, const void*, void*, void*, void*, void*, long long,
                         long long, long long, long long, long long, long long, long long, long long, long long,
                         const long long*, const long long*, const long long*, void*);
using Workspace = long long (*)(long long, long long, long long, long long, long long, long long, long long,
                                long long, long long);
using Launch = int (*)(const void*, const void*, const void*, void*, long long, long long, long long, long long,
                       long long, long long, long long, long long, long long, const long long*, const long long*,
                       void*);

uint64_t fnv1a(const std::vector<unsigned char>& bytes) {
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char c : bytes) h = (h ^ c) * 1099511628211ULL;
    return h;
}

// n elements of `bytes` each (4: fp32; 2: fp16 or bf16, `bf16` picking which) in [-1, 1) from a fixed LCG.
void fill(void* device, const size_t n, const int bytes, const bool bf16, uint32_t state) {
    std::vector<unsigned char> host(n * bytes);
    for (size_t i = 0; i < n; ++i) {
        state = state * 1664525u + 1013904223u;
        const float f = static_cast<float>(state >> 8) / 16777216.0f * 2.0f - 1.0f;
        if (bytes == 4) {
            memcpy(&host[i * 4], &f, 4);
        } else {
            uint32_t u;
            memcpy(&u, &f, 4);
            const uint16_t v = bf16 ? static_cast<uint16_t>(u >> 16) : __half_as_ushort(__float2half(f));
            memcpy(&host[i * 2], &v, 2);
        }
    }
    cudaMemcpy(device, host.data(), host.size(), cudaMemcpyHostToDevice);
}

// ONLY (a list of tags joined by '|'): run those cases alone (a rendering compiled for one signature, say).
bool skipped(const char* tag) {
    const char* only = getenv("ONLY");
    if (only == nullptr) return false;
    const size_t n = strlen(tag);
    for (const char* p = only; (p = strstr(p, tag)) != nullptr; p += n)
        if ((p == only || p[-1] == '|') && (p[n] == '\0' || p[n] == '|')) return false;
    return true;
}

// The median over 7 rounds of the mean of 100 calls, in ms (after 10 warm-up calls); one call when ONCE is set
// (under Nsight Compute).
template <typename F>
float median_ms(F call) {
    if (getenv("ONCE")) {
        call();
        return 0.0f;
    }
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    for (int i = 0; i < 10; ++i) call();
    std::vector<float> rounds;
    for (int r = 0; r < 7; ++r) {
        cudaEventRecord(a);
        for (int i = 0; i < 100; ++i) call();
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        float ms = 0.0f;
        cudaEventElapsedTime(&ms, a, b);
        rounds.push_back(ms / 100);
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(rounds.begin(), rounds.end());
    return rounds[3];
}

bool forward(const char* tag, const Launch launch, const int bytes, const bool bf16, const long long B,
             const long long C, const long long L, const long long K, const long long S, const long long P,
             const long long D, const bool blc = false) {
    if (skipped(tag)) return true;
    const long long Lout = (L + 2 * P - D * (K - 1) - 1) / S + 1;
    const size_t out_bytes = static_cast<size_t>(B * C * Lout * bytes);
    void *x, *w, *y, *copy;
    cudaMalloc(&x, B * C * L * bytes);
    cudaMalloc(&w, C * K * bytes);
    cudaMalloc(&y, out_bytes);
    cudaMalloc(&copy, out_bytes);
    fill(x, B * C * L, bytes, bf16, 10);
    fill(w, C * K, bytes, bf16, 20);
    // (B, C, L) memory, or (B, L, C) (channels contiguous, as a transposed view passes them; y the same)
    const long long xs[3] = {C * L, blc ? 1 : L, blc ? C : 1}, ys[3] = {C * Lout, blc ? 1 : Lout, blc ? C : 1};
    cudaMemset(y, 0xff, out_bytes);  // NaN in every dtype: an output left unwritten shows in the hash
    const auto call = [&] { return launch(x, w, nullptr, y, B, C, L, Lout, K, S, P, D, 0, xs, ys, nullptr); };
    const int rc = call();
    cudaDeviceSynchronize();
    std::vector<unsigned char> host(out_bytes);
    cudaMemcpy(host.data(), y, out_bytes, cudaMemcpyDeviceToHost);
    const float ms = median_ms(call);
    const cudaError_t err = cudaGetLastError();
    const float copy_ms = median_ms([&] { cudaMemcpyAsync(copy, y, out_bytes, cudaMemcpyDeviceToDevice); });
    printf("%-26s rc %d  %.4f ms  memcpy %.4f ms  %.2fx  hash %016llx  %s\n", tag, rc, ms, copy_ms,
           copy_ms > 0 ? ms / copy_ms : 0.0, static_cast<unsigned long long>(fnv1a(host)), cudaGetErrorString(err));
    cudaFree(x);
    cudaFree(w);
    cudaFree(y);
    cudaFree(copy);
    return rc == 0 && err == cudaSuccess;
}
// The backward (grad_x, grad_weight and grad_bias: the launch always writes all three) of a problem without
// activation; the hash covers grad_x and grad_weight.
bool backward(const char* tag, const Backward launch, const Workspace workspace, const int bytes, const bool bf16,
              const long long B, const long long C, const long long L, const long long K, const long long S,
              const long long P, const long long D) {
    if (skipped(tag)) return true;
    const long long Lout = (L + 2 * P - D * (K - 1) - 1) / S + 1;
    void *gy, *x, *w, *gx, *gw, *gb, *work;
    cudaMalloc(&gy, B * C * Lout * bytes);
    cudaMalloc(&x, B * C * L * bytes);
    cudaMalloc(&w, C * K * bytes);
    cudaMalloc(&gx, B * C * L * bytes);
    cudaMalloc(&gw, C * K * bytes);
    cudaMalloc(&gb, C * bytes);
    cudaMalloc(&work, workspace(B, C, L, Lout, K, S, P, D, 0) * sizeof(float) + 16);
    fill(gy, B * C * Lout, bytes, bf16, 30);
    fill(x, B * C * L, bytes, bf16, 32);
    fill(w, C * K, bytes, bf16, 34);
    cudaMemset(gx, 0xff, B * C * L * bytes);
    cudaMemset(gw, 0xff, C * K * bytes);
    const long long xs[3] = {C * L, L, 1}, gys[3] = {C * Lout, Lout, 1};
    const auto call = [&] {
        return launch(gy, x, w, nullptr, gx, gw, gb, work, B, C, L, Lout, K, S, P, D, 0, xs, gys, xs, nullptr);
    };
    const int rc = call();
    cudaDeviceSynchronize();
    std::vector<unsigned char> host(B * C * L * bytes + C * K * bytes);
    cudaMemcpy(host.data(), gx, B * C * L * bytes, cudaMemcpyDeviceToHost);
    cudaMemcpy(host.data() + B * C * L * bytes, gw, C * K * bytes, cudaMemcpyDeviceToHost);
    const float ms = median_ms(call);
    const cudaError_t err = cudaGetLastError();
    printf("%-26s rc %d  %.4f ms  hash %016llx  %s\n", tag, rc, ms, static_cast<unsigned long long>(fnv1a(host)),
           cudaGetErrorString(err));
    for (void* p : {gy, x, w, gx, gw, gb, work}) cudaFree(p);
    return rc == 0 && err == cudaSuccess;
}
}  // namespace

int main() {
    // (B, C, L, K, stride, padding, dilation): the bench's untuned-signature rows in (B, C, L), then longer rows
    bool ok = true;
    ok &= forward("fp16 16x512x2000 K15", dwgen_launch_dw1d_any_f16, 2, false, 16, 512, 2000, 15, 1, 7, 1);
    ok &= forward("fp32 8x1024x4000 K5 D2", dwgen_launch_dw1d_any_f32, 4, false, 8, 1024, 4000, 5, 1, 4, 2);
    ok &= forward("bf16 8x1024x6000 K3 S3", dwgen_launch_dw1d_any_bf16, 2, true, 8, 1024, 6000, 3, 3, 1, 1);
    ok &= forward("fp16 4x256x16000 K15", dwgen_launch_dw1d_any_f16, 2, false, 4, 256, 16000, 15, 1, 7, 1);
    ok &= forward("bf16 16x512x2001 K7", dwgen_launch_dw1d_any_bf16, 2, true, 16, 512, 2001, 7, 1, 3, 1);
    // strides and dilations past the bench's rows (the spread kernel's fills, small to a whole shared-memory span)
    ok &= forward("fp32 8x1024x6001 K3 S2", dwgen_launch_dw1d_any_f32, 4, false, 8, 1024, 6001, 3, 2, 1, 1);
    ok &= forward("fp16 8x1024x8000 K7 S4 D2", dwgen_launch_dw1d_any_f16, 2, false, 8, 1024, 8000, 7, 4, 6, 2);
    ok &= forward("bf16 16x512x4000 K9 D8", dwgen_launch_dw1d_any_bf16, 2, true, 16, 512, 4000, 9, 1, 32, 8);
    ok &= forward("fp32 4x512x8000 K31 D4", dwgen_launch_dw1d_any_f32, 4, false, 4, 512, 8000, 31, 1, 60, 4);
    // (B, L, C): the bench's stride-3 row, then a long filter, a dilation and C not a whole number of vectors
    ok &= forward("blc bf16 8x1024x6000 K3 S3", dwgen_launch_dw1d_any_bf16, 2, true, 8, 1024, 6000, 3, 3, 1, 1, true);
    ok &= forward("blc fp16 16x512x2000 K15", dwgen_launch_dw1d_any_f16, 2, false, 16, 512, 2000, 15, 1, 7, 1, true);
    ok &= forward("blc fp32 8x1024x4000 K5 D2", dwgen_launch_dw1d_any_f32, 4, false, 8, 1024, 4000, 5, 1, 4, 2, true);
    ok &= forward("blc fp16 32x512x1024 K31", dwgen_launch_dw1d_any_f16, 2, false, 32, 512, 1024, 31, 1, 15, 1, true);
    ok &= forward("blc bf16 8x1020x6000 K3 S2", dwgen_launch_dw1d_any_bf16, 2, true, 8, 1020, 6000, 3, 2, 1, 1, true);
    ok &= backward("bwd fp16 16x512x2000 K15", dwgen_launch_dw1d_bwd_any_f16, dwgen_workspace_dw1d_bwd_any_f16, 2,
                   false, 16, 512, 2000, 15, 1, 7, 1);
    ok &= backward("bwd fp32 8x1024x4000 K5 D2", dwgen_launch_dw1d_bwd_any_f32, dwgen_workspace_dw1d_bwd_any_f32, 4,
                   false, 8, 1024, 4000, 5, 1, 4, 2);
    ok &= backward("bwd bf16 16x512x2001 K7", dwgen_launch_dw1d_bwd_any_bf16, dwgen_workspace_dw1d_bwd_any_bf16, 2,
                   true, 16, 512, 2001, 7, 1, 3, 1);
    return ok ? 0 : 1;  // a failed launch or CUDA error fails the step
}
