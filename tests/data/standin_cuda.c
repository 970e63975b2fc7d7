/* A stand-in libcuda.so.1 for tests/test_driver_launch.py: records what a launcher passes to
 * cuLaunchKernelEx (the launch configuration, its attributes and the parameter bytes) so that
 * Triton's own generated launcher and jitkey's _LaunchPlan can be compared byte for byte on a
 * machine without a GPU. Built against Triton's bundled cuda.h, so the structures are the real ones.
 *
 * Record layout (standin_record): 7 x u32 config (grid xyz, block xyz, shared), u64 stream,
 * u64 function, u32 numAttrs, numAttrs x CUlaunchAttribute, then each parameter's bytes (sizes set
 * by standin_expect), then u32 cuFuncSetAttribute calls since the previous launch. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cuda.h"

#define MAX_PARAMS 256
static int g_nsizes = 0;
static int g_sizes[MAX_PARAMS];
static unsigned char g_record[65536];
static int g_record_len = 0;
static int g_launches = 0;
static int g_fail = 0;
static uint32_t g_func_attr_calls = 0;
static int g_ctx_current = 1;
static int g_ctx_retains = 0;

void standin_expect(int n, const int *sizes) {
  g_nsizes = n < MAX_PARAMS ? n : MAX_PARAMS;
  memcpy(g_sizes, sizes, sizeof(int) * g_nsizes);
}
void standin_fail(int code) { g_fail = code; }
void standin_no_context(void) { g_ctx_current = 0; }
int standin_launches(void) { return g_launches; }
int standin_ctx_retains(void) { return g_ctx_retains; }
int standin_record(unsigned char *out, int cap) {
  int n = g_record_len < cap ? g_record_len : cap;
  memcpy(out, g_record, n);
  return n;
}

static void put(const void *p, size_t n) {
  if (g_record_len + (int)n <= (int)sizeof(g_record)) {
    memcpy(g_record + g_record_len, p, n);
    g_record_len += (int)n;
  }
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra) {
  (void)extra;
  if (g_fail) return (CUresult)g_fail;
  g_launches++;
  g_record_len = 0;
  uint32_t cfg[7] = {config->gridDimX,  config->gridDimY,  config->gridDimZ,      config->blockDimX,
                     config->blockDimY, config->blockDimZ, config->sharedMemBytes};
  put(cfg, sizeof cfg);
  uint64_t stream = (uint64_t)(uintptr_t)config->hStream, fn = (uint64_t)(uintptr_t)f;
  put(&stream, 8);
  put(&fn, 8);
  uint32_t na = config->numAttrs;
  put(&na, 4);
  for (uint32_t i = 0; i < na; i++) put(&config->attrs[i], sizeof(CUlaunchAttribute));
  for (int i = 0; i < g_nsizes; i++) put(kernelParams[i], (size_t)g_sizes[i]);
  put(&g_func_attr_calls, 4);
  g_func_attr_calls = 0;
  return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
  *pctx = g_ctx_current ? (CUcontext)(uintptr_t)0x1 : NULL;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  *device = ordinal;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  (void)dev;
  g_ctx_retains++;
  *pctx = (CUcontext)(uintptr_t)0x1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  g_ctx_current = ctx != NULL;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  (void)hfunc;
  (void)attrib;
  (void)value;
  g_func_attr_calls++;
  return CUDA_SUCCESS;
}
/* Device memory is any address >= 0x10000; below it, "host memory" (CUDA_ERROR_INVALID_VALUE). */
CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  (void)attribute;
  if (ptr < 0x10000) return CUDA_ERROR_INVALID_VALUE;
  *(CUdeviceptr *)data = ptr;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
  static char buf[64];
  snprintf(buf, sizeof buf, "stand-in error %d", (int)error);
  *pStr = buf;
  return CUDA_SUCCESS;
}
