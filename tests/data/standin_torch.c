/* A stand-in for the two functions of torch's stable C shim that jitkey resolves
 * (torch/csrc/inductor/aoti_torch/c/shim.h): aoti_torch_get_current_device_index and
 * aoti_torch_get_current_cuda_stream, for tests/test_torch_current.py on a machine without a GPU. The test
 * sets what they return (standin_set), makes them fail (standin_fail: the AOTITorchError they return),
 * can make the stream read ignore the current stream (standin_frozen), and counts the calls. */
#include <stdint.h>

#define MAX_DEVICES 8
static int32_t g_device = 0;
static void *g_streams[MAX_DEVICES];
static void *g_frozen = 0;
static int g_frozen_on = 0;
static int32_t g_fail = 0;
static int g_calls = 0;

/* The current device and the current stream of `device`. */
void standin_set(int32_t device, void *stream) {
  g_device = device;
  if (device >= 0 && device < MAX_DEVICES) g_streams[device] = stream;
}
/* Every call returns `code` (0: succeeds). */
void standin_fail(int32_t code) { g_fail = code; }
/* The stream read returns `stream` whatever is current (`on` = 0: follows standin_set again). */
void standin_frozen(int on, void *stream) {
  g_frozen_on = on;
  g_frozen = stream;
}
int standin_calls(void) { return g_calls; }

int32_t aoti_torch_get_current_device_index(int32_t *ret_device_index) {
  g_calls++;
  if (g_fail) return g_fail;
  *ret_device_index = g_device;
  return 0;
}

int32_t aoti_torch_get_current_cuda_stream(int32_t device_index, void **ret_stream) {
  g_calls++;
  if (g_fail) return g_fail;
  if (device_index < 0 || device_index >= MAX_DEVICES) return 1;
  *ret_stream = g_frozen_on ? g_frozen : g_streams[device_index];
  return 0;
}
