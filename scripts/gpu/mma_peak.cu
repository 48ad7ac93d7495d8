// The tensor-core ceilings the exact GPU reference (kernels/reference.cu) is held to:
// mma.sync m16n8k32 s8 (its integer-limb dots, IMMA=1) and m16n8k16 f64 (its f64 dots,
// DW=1), eight independent accumulators per warp, no memory traffic; and int32 -> f64
// by conversion against the exponent trick the integer path uses. BENCHMARKS.md keeps
// the numbers. Built and run by scripts/gpu-check.sh (campaigns) where nvcc is:
//   nvcc -arch=sm_90a -O3 scripts/gpu/mma_peak.cu -o mma_peak && ./mma_peak
#include <cstdio>
#include <cuda_runtime.h>
#define CH 8

__global__ void imma(int* out, int iters) {
    unsigned a0 = threadIdx.x, a1 = a0 * 3, a2 = a0 * 5, a3 = a0 * 7, b0 = a0 * 11, b1 = a0 * 13;
    int c[CH][4] = {};
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int k = 0; k < CH; k++)
            asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                         : "+r"(c[k][0]), "+r"(c[k][1]), "+r"(c[k][2]), "+r"(c[k][3])
                         : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
    int s = 0;
    for (int k = 0; k < CH; k++) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void dmma(double* out, int iters) {
    double a[8], b[4];
    for (int j = 0; j < 8; j++) a[j] = threadIdx.x + j;
    for (int j = 0; j < 4; j++) b[j] = threadIdx.x * 0.5 + j;
    double c[CH][4] = {};
    for (int i = 0; i < iters; i++) {
#pragma unroll
        for (int k = 0; k < CH; k++)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0,%1,%2,%3}, {%4,%5,%6,%7,%8,%9,%10,%11}, {%12,%13,%14,%15}, {%0,%1,%2,%3};\n"
                         : "+d"(c[k][0]), "+d"(c[k][1]), "+d"(c[k][2]), "+d"(c[k][3])
                         : "d"(a[0]), "d"(a[1]), "d"(a[2]), "d"(a[3]), "d"(a[4]), "d"(a[5]), "d"(a[6]), "d"(a[7]),
                           "d"(b[0]), "d"(b[1]), "d"(b[2]), "d"(b[3]));
    }
    double s = 0;
    for (int k = 0; k < CH; k++) s += c[k][0] + c[k][1] + c[k][2] + c[k][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

__global__ void to_f64(double* out, int iters, int trick) {
    int x = threadIdx.x;
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int i = 0; i < iters; i++) {
        if (trick) {  // 1.5 * 2^52 + x, minus 1.5 * 2^52 (x >= 0 here)
            s0 += __hiloint2double(0x43380000, x + i) - 6755399441055744.0;
            s1 += __hiloint2double(0x43380000, x ^ i) - 6755399441055744.0;
            s2 += __hiloint2double(0x43380000, x | i) - 6755399441055744.0;
            s3 += __hiloint2double(0x43380000, x & i) - 6755399441055744.0;
        } else {
            s0 += (double)(x + i); s1 += (double)(x ^ i); s2 += (double)(x | i); s3 += (double)(x & i);
        }
    }
    out[blockIdx.x * blockDim.x + threadIdx.x] = s0 + s1 + s2 + s3;
}

int main() {
    int dev;
    cudaDeviceProp pr;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceProperties(&pr, dev) != cudaSuccess) { printf("no GPU\n"); return 3; }
    const int sms = pr.multiProcessorCount;
    printf("%s, %d SMs\n", pr.name, sms);
    void* buf;
    cudaMalloc(&buf, 64 << 20);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms;
    const int iters = 4096;
    for (int wpb : {4, 8}) {
        for (int per_sm : {1, 2, 4}) {
            dim3 g(sms * per_sm), b(32 * wpb);
            imma<<<g, b>>>((int*)buf, 16);
            cudaEventRecord(e0); imma<<<g, b>>>((int*)buf, iters); cudaEventRecord(e1); cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
            double macs = (double)g.x * wpb * iters * CH * 16 * 8 * 32;
            printf("m16n8k32 s8:  %d warps/CTA, %d CTAs/SM: %.1f TOPS\n", wpb, per_sm, 2 * macs / ms / 1e9);
            dmma<<<g, b>>>((double*)buf, 16);
            cudaEventRecord(e0); dmma<<<g, b>>>((double*)buf, iters / 4); cudaEventRecord(e1); cudaEventSynchronize(e1);
            cudaEventElapsedTime(&ms, e0, e1);
            macs = (double)g.x * wpb * (iters / 4) * CH * 16 * 8 * 16;
            printf("m16n8k16 f64: %d warps/CTA, %d CTAs/SM: %.1f TFLOPS\n", wpb, per_sm, 2 * macs / ms / 1e9);
        }
    }
    for (int trick : {0, 1}) {
        dim3 g(sms * 4), b(256);
        to_f64<<<g, b>>>((double*)buf, 16, trick);
        cudaEventRecord(e0); to_f64<<<g, b>>>((double*)buf, 16384, trick); cudaEventRecord(e1); cudaEventSynchronize(e1);
        cudaEventElapsedTime(&ms, e0, e1);
        printf("int32 -> f64 %s: %.0f G/s\n", trick ? "by the exponent trick (one DADD)" : "by conversion (I2F.F64)", (double)g.x * 256 * 16384 * 4 / ms / 1e6);
    }
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) { printf("CUDA error: %s\n", cudaGetErrorString(err)); return 1; }
    return 0;
}
