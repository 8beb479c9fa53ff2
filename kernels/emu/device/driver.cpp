// The emulated device: a libcuda.so that runs kernels/*.cu on the host through the emulator
// (cargo feature `emu`; build.rs links it as OUT_DIR/emu/device/libcuda.so).
//
// cudarc opens "libcuda.so" by name and looks each driver function up when first called, so
// loading this library first (src/emu/device.rs) or putting its folder on LD_LIBRARY_PATH runs the
// whole CUDA backend, its host code included, without a GPU: the same context set-up, uploads,
// plan chunks, launch geometry and cuBLASLt calls (kernels/emu/device/cublaslt.cpp) as on the
// H200, against host memory.
//
// What it models, and checks the way a driver would (an error code, with the reason as the
// code's error string):
// - one device, "toolsift emulated device", reporting an H200's limits (132 SMs, 227 KiB of
//   opt-in shared memory per block, compute capability 9.0);
// - device memory as guarded host mappings (an access past the end of an allocation stops the
//   process naming the kernel, block, thread and allocation); copies, memsets and every pointer
//   argument of a launch must lie inside a live allocation; one memory pool that every
//   allocation comes from, with the driver's accounting (bytes in use, their high-water mark);
// - modules from PTX text: each `.entry` must be a kernel the emulator has (kernels/*.cu built for
//   the host), so the PTX and the host build cannot drift apart unnoticed;
// - launches: more than 48 KiB of dynamic shared memory needs the function's
//   MAX_DYNAMIC_SHARED_SIZE_BYTES attribute first, as on the device; block and grid limits;
//   each launch runs to completion before cuLaunchKernel returns, with a thread order drawn
//   from TOOLSIFT_EMU_SEED (default 1) and the launch's index.
// Everything is synchronous: streams and events only order what is already ordered. Errors are
// not sticky (a failed launch does not poison the context).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "registry.h"

extern "C" void* toolsift_emu_alloc(size_t bytes, const char* label);
extern "C" void toolsift_emu_free(void* data);

#define EXPORT extern "C" __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;

enum : CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES = 701,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

struct CUctx_st {
    int device;
};
struct CUmod_st {
    std::vector<std::string> entries;  // the `.entry` names of the module's PTX
    std::map<std::string, struct CUfunc_st*> functions;
};
struct CUfunc_st {
    const toolsift_emu_device::Entry* entry;
    int max_dynamic_smem;
};
struct CUstream_st {
    int unused;
};
struct CUevent_st {
    std::chrono::steady_clock::time_point at;
};
struct CUmemPoolHandle_st {
    int unused;
};
typedef CUctx_st* CUcontext;
typedef CUmod_st* CUmodule;
typedef CUfunc_st* CUfunction;
typedef CUstream_st* CUstream;
typedef CUevent_st* CUevent;
typedef CUmemPoolHandle_st* CUmemoryPool;

namespace {

// An H200 (docs/results/h200.md), so launchers size grids and shared memory as they would there.
constexpr const char* DEVICE_NAME = "toolsift emulated device (host CPU)";
constexpr int SM_COUNT = 132;
constexpr int SMEM_PER_BLOCK = 48 * 1024;
constexpr int SMEM_OPTIN = 227 * 1024;
constexpr size_t DEFAULT_TOTAL_BYTES = size_t(16) << 30;

std::mutex g_lock;
bool g_initialised = false;
CUctx_st g_primary{0};
thread_local CUcontext t_current = nullptr;
// Live allocations: start -> bytes.
std::map<uintptr_t, size_t> g_allocations;
size_t g_allocated = 0;
// The most g_allocated has been since the memory pool's high-water mark was last reset.
size_t g_allocated_high = 0;
// The device's one memory pool: every allocation, cuMemAlloc's too, comes from it.
CUmemPoolHandle_st g_pool{0};
uint64_t g_allocation_count = 0;
uint64_t g_launches = 0;
// The reason for the last error and its code: cuGetErrorString of that code returns it.
thread_local std::string t_reason;
thread_local CUresult t_reason_code = CUDA_SUCCESS;

CUresult fail(CUresult code, const std::string& reason) {
    t_reason = reason;
    t_reason_code = code;
    fprintf(stderr, "toolsift emulated device: %s\n", reason.c_str());
    return code;
}

// Whether [p, p + bytes) lies inside one live allocation (caller holds g_lock).
bool inside(uintptr_t p, size_t bytes) {
    auto it = g_allocations.upper_bound(p);
    if (it == g_allocations.begin()) return false;
    --it;
    return p >= it->first && p - it->first <= it->second && bytes <= it->second - (p - it->first);
}

CUresult check_span(CUdeviceptr p, size_t bytes, const char* what) {
    std::lock_guard<std::mutex> lock(g_lock);
    if (inside((uintptr_t)p, bytes)) return CUDA_SUCCESS;
    char msg[200];
    snprintf(msg, sizeof msg, "%s: [0x%llx, +%zu bytes) is not inside one device allocation",
             what, p, bytes);
    return fail(CUDA_ERROR_INVALID_VALUE, msg);
}

uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t seed_base() {
    static const uint64_t base = [] {
        const char* s = getenv("TOOLSIFT_EMU_SEED");
        return s && *s ? strtoull(s, nullptr, 0) : 1ull;
    }();
    return base;
}

// The device's memory: 16 GiB, or TOOLSIFT_EMU_DEVICE_BYTES (a test of what happens when an
// allocation fails sets it small, in a process of its own).
size_t device_bytes() {
    static const size_t total = [] {
        const char* s = getenv("TOOLSIFT_EMU_DEVICE_BYTES");
        return s && *s ? (size_t)strtoull(s, nullptr, 0) : DEFAULT_TOTAL_BYTES;
    }();
    return total;
}

CUresult allocate(CUdeviceptr* dptr, size_t bytes) {
    if (!dptr) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g_lock);
    if (bytes > device_bytes() - g_allocated)
        return CUDA_ERROR_OUT_OF_MEMORY;
    char label[96];
    snprintf(label, sizeof label, "device allocation #%llu (%zu bytes)",
             (unsigned long long)++g_allocation_count, bytes);
    void* p = toolsift_emu_alloc(bytes, label);
    if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
    g_allocations[(uintptr_t)p] = bytes;
    g_allocated += bytes;
    if (g_allocated > g_allocated_high) g_allocated_high = g_allocated;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult release(CUdeviceptr dptr) {
    std::lock_guard<std::mutex> lock(g_lock);
    auto it = g_allocations.find((uintptr_t)dptr);
    if (it == g_allocations.end()) {
        char msg[120];
        snprintf(msg, sizeof msg, "freeing 0x%llx, which is not the start of an allocation", dptr);
        return fail(CUDA_ERROR_INVALID_VALUE, msg);
    }
    g_allocated -= it->second;
    g_allocations.erase(it);
    toolsift_emu_free((void*)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

}  // namespace

namespace toolsift_emu_device {

bool is_device_pointer(const void* ptr) {
    std::lock_guard<std::mutex> lock(g_lock);
    return inside((uintptr_t)ptr, 0);
}

namespace {
std::map<std::string, const Entry*>& table() {
    static std::map<std::string, const Entry*> t;
    return t;
}
}  // namespace

int register_entries(const Entry* entries, size_t n) {
    for (size_t i = 0; i < n; ++i) table()[entries[i].name] = &entries[i];
    return (int)n;
}

const Entry* find_entry(const char* name) {
    auto it = table().find(name);
    return it == table().end() ? nullptr : it->second;
}

}  // namespace toolsift_emu_device

// ---- errors, initialisation, the device ------------------------------------------------------

EXPORT CUresult cuGetErrorString(CUresult error, const char** str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    static thread_local std::string text;
    text = error == t_reason_code ? "toolsift emulated device: " + t_reason
                                  : "toolsift emulated device: error " + std::to_string(error);
    *str = text.c_str();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorName(CUresult error, const char** str) {
    if (!str) return CUDA_ERROR_INVALID_VALUE;
    static thread_local std::string text;
    text = "CUresult " + std::to_string(error);
    *str = text.c_str();
    return CUDA_SUCCESS;
}

// Marks this library as the emulated device (src/emu/device.rs checks which libcuda cudarc has).
EXPORT int toolsift_emu_device_marker(void) { return 1; }

EXPORT CUresult cuInit(unsigned flags) {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g_lock);
    g_initialised = true;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int* version) {
    if (!version) return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetCount(int* count) {
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = 1;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (!g_initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *device = 0;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
    if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "%s", DEVICE_NAME);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
        case 1: *value = 1024; break;                    // MAX_THREADS_PER_BLOCK
        case 2: case 3: *value = 1024; break;            // MAX_BLOCK_DIM_X, _Y
        case 4: *value = 64; break;                      // MAX_BLOCK_DIM_Z
        case 5: *value = 0x7fffffff; break;              // MAX_GRID_DIM_X
        case 6: case 7: *value = 65535; break;           // MAX_GRID_DIM_Y, _Z
        case 8: *value = SMEM_PER_BLOCK; break;          // MAX_SHARED_MEMORY_PER_BLOCK
        case 10: *value = 32; break;                     // WARP_SIZE
        case 16: *value = SM_COUNT; break;               // MULTIPROCESSOR_COUNT
        case 41: *value = 1; break;                      // UNIFIED_ADDRESSING
        case 75: *value = 9; break;                      // COMPUTE_CAPABILITY_MAJOR
        case 76: *value = 0; break;                      // COMPUTE_CAPABILITY_MINOR
        case 81: *value = 228 * 1024; break;             // MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
        case 97: *value = SMEM_OPTIN; break;             // MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
        case 115: *value = 1; break;                     // MEMORY_POOLS_SUPPORTED
        default: *value = 0; break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
    if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    *bytes = device_bytes();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetInfo_v2(size_t* free_bytes, size_t* total_bytes) {
    if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g_lock);
    *total_bytes = device_bytes();
    *free_bytes = device_bytes() - g_allocated;
    return CUDA_SUCCESS;
}

// ---- contexts ----------------------------------------------------------------------------------

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
    if (!g_initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = &g_primary;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    return device == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
    if (!ctx) return CUDA_ERROR_INVALID_VALUE;
    *ctx = t_current;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ctx && ctx != &g_primary) return CUDA_ERROR_INVALID_CONTEXT;
    t_current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSynchronize(void) { return CUDA_SUCCESS; }

// ---- streams and events (everything already ran when it was enqueued) --------------------------

EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned flags) {
    (void)flags;
    if (!stream) return CUDA_ERROR_INVALID_VALUE;
    *stream = new CUstream_st{0};
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreateWithPriority(CUstream* stream, unsigned flags, int priority) {
    (void)priority;
    return cuStreamCreate(stream, flags);
}

EXPORT CUresult cuStreamDestroy_v2(CUstream stream) {
    delete stream;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
EXPORT CUresult cuStreamQuery(CUstream) { return CUDA_SUCCESS; }
EXPORT CUresult cuStreamWaitEvent(CUstream, CUevent, unsigned) { return CUDA_SUCCESS; }

EXPORT CUresult cuEventCreate(CUevent* event, unsigned flags) {
    (void)flags;
    if (!event) return CUDA_ERROR_INVALID_VALUE;
    *event = new CUevent_st{std::chrono::steady_clock::now()};
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(CUevent event) {
    delete event;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(CUevent event, CUstream) {
    if (!event) return CUDA_ERROR_INVALID_HANDLE;
    event->at = std::chrono::steady_clock::now();
    return CUDA_SUCCESS;
}

EXPORT CUresult cuEventSynchronize(CUevent) { return CUDA_SUCCESS; }
EXPORT CUresult cuEventQuery(CUevent) { return CUDA_SUCCESS; }

EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent end) {
    if (!ms || !start || !end) return CUDA_ERROR_INVALID_VALUE;
    *ms = std::chrono::duration<float, std::milli>(end->at - start->at).count();
    return CUDA_SUCCESS;
}

// CUDA 13's name for it: cudarc's bindings (feature `cuda-13000`) call this one.
EXPORT CUresult cuEventElapsedTime_v2(float* ms, CUevent start, CUevent end) {
    return cuEventElapsedTime(ms, start, end);
}

// ---- memory ------------------------------------------------------------------------------------

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr* dptr, size_t bytes) { return allocate(dptr, bytes); }
EXPORT CUresult cuMemAllocAsync(CUdeviceptr* dptr, size_t bytes, CUstream) {
    return allocate(dptr, bytes);
}
EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(dptr); }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream) { return release(dptr); }

// The memory pool's accounting, as the driver keeps it for cuMemAllocAsync: bytes in use and
// their high-water mark (CUmemPool_attribute 7 and 8; nothing is cached, so the reserved bytes,
// 5 and 6, are the same). Only a high-water mark can be set, and only to 0, which restarts it
// from the bytes in use.
EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool* pool, CUdevice device) {
    if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
    if (!pool) return CUDA_ERROR_INVALID_VALUE;
    *pool = &g_pool;
    return CUDA_SUCCESS;
}
EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool* pool, CUdevice device) {
    return cuDeviceGetMemPool(pool, device);
}
EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attribute, void* value) {
    if (pool != &g_pool || !value) return CUDA_ERROR_INVALID_VALUE;
    std::lock_guard<std::mutex> lock(g_lock);
    switch (attribute) {
        case 5: case 7: *(uint64_t*)value = g_allocated; return CUDA_SUCCESS;
        case 6: case 8: *(uint64_t*)value = g_allocated_high; return CUDA_SUCCESS;
        default: return fail(CUDA_ERROR_NOT_SUPPORTED, "cuMemPoolGetAttribute: attribute " +
                                                           std::to_string(attribute));
    }
}
EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attribute, void* value) {
    if (pool != &g_pool || !value) return CUDA_ERROR_INVALID_VALUE;
    if (attribute != 6 && attribute != 8)
        return fail(CUDA_ERROR_NOT_SUPPORTED,
                    "cuMemPoolSetAttribute: attribute " + std::to_string(attribute));
    if (*(uint64_t*)value != 0)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuMemPoolSetAttribute: a high-water mark resets to 0");
    std::lock_guard<std::mutex> lock(g_lock);
    g_allocated_high = g_allocated;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t n) {
    if (CUresult r = check_span(dst, n, "cuMemsetD8")) return r;
    memset((void*)(uintptr_t)dst, value, n);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, CUstream) {
    return cuMemsetD8_v2(dst, value, n);
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    if (CUresult r = check_span(dst, bytes, "cuMemcpyHtoD destination")) return r;
    memcpy((void*)(uintptr_t)dst, src, bytes);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, CUstream) {
    return cuMemcpyHtoD_v2(dst, src, bytes);
}

EXPORT CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    if (CUresult r = check_span(src, bytes, "cuMemcpyDtoH source")) return r;
    memcpy(dst, (const void*)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, CUstream) {
    return cuMemcpyDtoH_v2(dst, src, bytes);
}

EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    if (CUresult r = check_span(src, bytes, "cuMemcpyDtoD source")) return r;
    if (CUresult r = check_span(dst, bytes, "cuMemcpyDtoD destination")) return r;
    memmove((void*)(uintptr_t)dst, (const void*)(uintptr_t)src, bytes);
    return CUDA_SUCCESS;
}
EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream) {
    return cuMemcpyDtoD_v2(dst, src, bytes);
}

// Whether [ptr, ptr + bytes) lies inside one device allocation (kernels/emu/device/cublaslt.cpp).
EXPORT int toolsift_emu_device_span(const void* ptr, size_t bytes) {
    std::lock_guard<std::mutex> lock(g_lock);
    return inside((uintptr_t)ptr, bytes);
}

// ---- modules and functions ---------------------------------------------------------------------

EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
    if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
    const char* ptx = static_cast<const char*>(image);
    if (!strstr(ptx, ".version") || !strstr(ptx, ".target"))
        return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: the image is not PTX text");
    CUmod_st* m = new CUmod_st;
    for (const char* at = strstr(ptx, ".entry "); at; at = strstr(at + 1, ".entry ")) {
        at += strlen(".entry ");
        size_t n = strcspn(at, "( \t\n");
        std::string name(at, n);
        if (!toolsift_emu_device::find_entry(name.c_str())) {
            delete m;
            return fail(CUDA_ERROR_INVALID_IMAGE,
                        "cuModuleLoadData: the PTX has kernel " + name +
                            ", which the emulator's host build of kernels/*.cu lacks");
        }
        m->entries.push_back(name);
    }
    *module = m;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleUnload(CUmodule module) {
    if (!module) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& f : module->functions) delete f.second;
    delete module;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuModuleGetFunction(CUfunction* function, CUmodule module, const char* name) {
    if (!function || !module || !name) return CUDA_ERROR_INVALID_VALUE;
    bool listed = false;
    for (const std::string& e : module->entries) listed = listed || e == name;
    if (!listed) return fail(CUDA_ERROR_NOT_FOUND, std::string("no kernel ") + name + " in module");
    CUfunc_st*& f = module->functions[name];
    if (!f) f = new CUfunc_st{toolsift_emu_device::find_entry(name), SMEM_PER_BLOCK};
    *function = f;
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetAttribute(CUfunction f, int attribute, int value) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    if (attribute == 8) {  // MAX_DYNAMIC_SHARED_SIZE_BYTES
        if (value < 0 || value > SMEM_OPTIN) {
            char msg[160];
            if (value < 0)
                snprintf(msg, sizeof msg, "%s: MAX_DYNAMIC_SHARED_SIZE_BYTES %d is negative",
                         f->entry->name, value);
            else
                snprintf(msg, sizeof msg,
                         "%s: MAX_DYNAMIC_SHARED_SIZE_BYTES %d is over the opt-in limit %d",
                         f->entry->name, value, SMEM_OPTIN);
            return fail(CUDA_ERROR_INVALID_VALUE, msg);
        }
        f->max_dynamic_smem = value;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncGetAttribute(int* value, int attribute, CUfunction f) {
    if (!value || !f) return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
        case 0: *value = 1024; break;                 // MAX_THREADS_PER_BLOCK
        case 8: *value = f->max_dynamic_smem; break;  // MAX_DYNAMIC_SHARED_SIZE_BYTES
        default: *value = 0; break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult cuFuncSetCacheConfig(CUfunction f, int) {
    return f ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned smem_bytes, CUstream,
                               void** params, void** extra) {
    if (!f) return CUDA_ERROR_INVALID_HANDLE;
    const char* name = f->entry->name;
    char msg[4096];
    if (extra) {
        snprintf(msg, sizeof msg, "%s: the `extra` argument form is not emulated", name);
        return fail(CUDA_ERROR_NOT_SUPPORTED, msg);
    }
    if ((int)smem_bytes > f->max_dynamic_smem) {
        snprintf(msg, sizeof msg,
                 "%s: %u bytes of dynamic shared memory, over the function's limit of %d "
                 "(cuFuncSetAttribute MAX_DYNAMIC_SHARED_SIZE_BYTES)",
                 name, smem_bytes, f->max_dynamic_smem);
        return fail(CUDA_ERROR_INVALID_VALUE, msg);
    }
    const unsigned long long threads = (unsigned long long)bx * by * bz;
    if (threads == 0 || threads > 1024 || bz > 64 || gx == 0 || gy == 0 || gz == 0 ||
        gy > 65535 || gz > 65535) {
        snprintf(msg, sizeof msg, "%s: grid (%u, %u, %u), block (%u, %u, %u) is out of range",
                 name, gx, gy, gz, bx, by, bz);
        return fail(CUDA_ERROR_INVALID_VALUE, msg);
    }
    toolsift_emu_device::Geometry g{{gx, gy, gz}, {bx, by, bz}, smem_bytes, 0};
    {
        std::lock_guard<std::mutex> lock(g_lock);
        g.seed = splitmix(seed_base() + g_launches++);
    }
    if (f->entry->launch(name, params, g, msg, sizeof msg))
        return fail(CUDA_ERROR_LAUNCH_FAILED, msg);
    return CUDA_SUCCESS;
}
