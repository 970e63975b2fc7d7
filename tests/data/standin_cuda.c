/* A stand-in libcuda.so.1 for tests/test_driver_launch.py: records what a launcher passes to
 * cuLaunchKernelEx (the launch configuration, its attributes and the parameter bytes) so that
 * Triton's own launcher (3.6: generated per signature; 3.9: driver.c's generic launch) and jitkey's
 * _LaunchPlan can be compared byte for byte on a machine without a GPU. Built against the bundled
 * cuda.h of the Triton under test, so the structures are the real ones.
 *
 * Record layout (standin_record): 7 x u32 config (grid xyz, block xyz, shared), u64 stream,
 * u64 function, u32 numAttrs, numAttrs x CUlaunchAttribute, then each parameter's bytes (sizes set
 * by standin_expect), then u32 cuFuncSetAttribute calls since the previous launch (or standin_calls).
 *
 * Call log (standin_calls): one letter per driver call of the launch path since the last read, in
 * order: G cuCtxGetCurrent, D cuDeviceGet, R cuDevicePrimaryCtxRetain, S cuCtxSetCurrent,
 * A cuFuncSetAttribute, P cuPointerGetAttribute, L cuLaunchKernelEx. */
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
static int g_ctx_fail = 0;
static int g_func_attr_fail = 0;
static char g_calls[4096];
static int g_ncalls = 0;

static void called(char c) {
  if (g_ncalls < (int)sizeof(g_calls) - 1) g_calls[g_ncalls++] = c;
}

void standin_expect(int n, const int *sizes) {
  g_nsizes = n < MAX_PARAMS ? n : MAX_PARAMS;
  memcpy(g_sizes, sizes, sizeof(int) * g_nsizes);
}
void standin_fail(int code) { g_fail = code; }
void standin_no_context(void) { g_ctx_current = 0; }
/* cuCtxGetCurrent fails with `code` (0: succeeds), leaving NULL in *pctx. */
void standin_ctx_fail(int code) { g_ctx_fail = code; }
/* cuFuncSetAttribute fails with `code` (0: succeeds). */
void standin_func_attr_fail(int code) { g_func_attr_fail = code; }
/* The call log since the last read (NUL-terminated into out), then cleared with the record's
 * cuFuncSetAttribute count (a launch that failed before cuLaunchKernelEx leaves none behind). */
int standin_calls(char *out, int cap) {
  int n = g_ncalls < cap - 1 ? g_ncalls : cap - 1;
  memcpy(out, g_calls, n);
  out[n] = 0;
  g_ncalls = 0;
  g_func_attr_calls = 0;
  return n;
}
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
  called('L');
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
  called('G');
  *pctx = g_ctx_current && !g_ctx_fail ? (CUcontext)(uintptr_t)0x1 : NULL;
  return (CUresult)g_ctx_fail;
}
CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
  called('D');
  *device = ordinal;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
  (void)dev;
  called('R');
  g_ctx_retains++;
  *pctx = (CUcontext)(uintptr_t)0x1;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
  called('S');
  g_ctx_current = ctx != NULL;
  return CUDA_SUCCESS;
}
CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value) {
  (void)hfunc;
  (void)attrib;
  (void)value;
  called('A');
  g_func_attr_calls++;
  return (CUresult)g_func_attr_fail;
}
/* Device memory is any address >= 0x10000; below it, "host memory" (CUDA_ERROR_INVALID_VALUE). */
CUresult CUDAAPI cuPointerGetAttribute(void *data, CUpointer_attribute attribute, CUdeviceptr ptr) {
  (void)attribute;
  called('P');
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

/* Entry points Triton 3.9's driver.c (CudaUtils) links against but no launch calls (module loading,
 * device queries, limits, stream capture): present so that the module loads, failing if called. */
CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
  (void)device;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuCtxGetLimit(size_t *pvalue, CUlimit limit) {
  (void)pvalue;
  (void)limit;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuCtxSetLimit(CUlimit limit, size_t value) {
  (void)limit;
  (void)value;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
  (void)pi;
  (void)attrib;
  (void)dev;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
  (void)driverVersion;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
  (void)pi;
  (void)attrib;
  (void)hfunc;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuFuncSetCacheConfig(CUfunction hfunc, CUfunc_cache config) {
  (void)hfunc;
  (void)config;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
  (void)hfunc;
  (void)hmod;
  (void)name;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuModuleLoadData(CUmodule *module, const void *image) {
  (void)module;
  (void)image;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  (void)hmod;
  return CUDA_ERROR_NOT_SUPPORTED;
}
CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus) {
  (void)hStream;
  (void)captureStatus;
  return CUDA_ERROR_NOT_SUPPORTED;
}
