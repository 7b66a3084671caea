// How many blocks stay resident when a kernel is launched as thread-block clusters of 1, 2, 4 or 8 blocks,
// against a plain launch, for 64-, 128- and 256-thread blocks (the lane backward's sizes). The lane backward's
// cluster designs measured slower the smaller their blocks (docs/perf-notes.md, nineteenth session); this asks
// the occupancy API why. Build and run on the GPU host:
//     nvcc -arch=sm_90 -o /tmp/cluster-occupancy scripts/cluster-occupancy.cu && /tmp/cluster-occupancy
#include <cuda_runtime.h>

#include <cstdio>

// A stand-in of the lane backward's weight: a few registers and a little shared memory.
template <int T>
__global__ void __launch_bounds__(T) stand_in(float* p) {
    __shared__ float s[T];
    s[threadIdx.x] = p[threadIdx.x];
    __syncthreads();
    p[threadIdx.x] = s[T - 1 - threadIdx.x];
}

template <int T>
void report() {
    int per_sm = 0, sms = 0;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stand_in<T>, T, 0);
    printf("threads %d: %d blocks an SM x %d SMs = %d resident without clusters\n", T, per_sm, sms, per_sm * sms);
    for (int n = 1; n <= 8; n *= 2) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(4096, n);
        cfg.blockDim = dim3(T);
        cudaLaunchAttribute cluster[1];
        cluster[0].id = cudaLaunchAttributeClusterDimension;
        cluster[0].val.clusterDim.x = 1;
        cluster[0].val.clusterDim.y = n;
        cluster[0].val.clusterDim.z = 1;
        cfg.attrs = cluster;
        cfg.numAttrs = 1;
        int clusters = 0;
        const cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, stand_in<T>, &cfg);
        printf("  clusters of %d: %d clusters resident = %d blocks (%s)\n", n, clusters, clusters * n,
               cudaGetErrorString(e));
    }
}

int main() {
    report<64>();
    report<128>();
    report<256>();
    return 0;
}
