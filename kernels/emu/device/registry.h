// The emulated device's kernel table (kernels/emu/device): every exported kernel of kernels/*.cu,
// found by name, launched from a driver-style argument array.
//
// cuLaunchKernel hands over `void** params`, one pointer per argument to where its value lies;
// only the kernel's own signature says how to read them. build.rs lists each .cu's entry points
// and ends a copy of the file with TOOLSIFT_EMU_ENTRIES(name, ...), so the compiler reads every
// signature from the definition itself (`decltype(&name)`): nothing restates it by hand.
#pragma once

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <type_traits>
#include <utility>

extern "C" int toolsift_emu_launch(const char* name, const unsigned grid[3],
                                   const unsigned block[3], size_t smem_bytes, uint64_t seed,
                                   void (*body)(void*), void* ctx, char* err, size_t err_len);

namespace toolsift_emu_device {

struct Geometry {
    unsigned grid[3];
    unsigned block[3];
    size_t smem_bytes;
    uint64_t seed;
};

// Whether `ptr` lies inside a live device allocation (checks a kernel's pointer arguments).
bool is_device_pointer(const void* ptr);

struct Entry {
    const char* name;
    // Checks the pointer arguments, then runs the launch; 0, or 1 with a message in `err`.
    int (*launch)(const char* name, void** params, const Geometry& g, char* err, size_t err_len);
};

// Adds `n` entries to the table (at load time, from each kernel file's static initialiser).
int register_entries(const Entry* entries, size_t n);
// The entry of kernel `name`, or null.
const Entry* find_entry(const char* name);

template <typename Fn>
struct Launcher;

template <typename... A>
struct Launcher<void (*)(A...)> {
    template <void (*F)(A...)>
    struct For {
        template <size_t... I>
        static void call(void** params, std::index_sequence<I...>) {
            F(*static_cast<A*>(params[I])...);
        }

        static void body(void* params) {
            call(static_cast<void**>(params), std::index_sequence_for<A...>{});
        }

        template <size_t... I>
        static int check_pointers(const char* name, void** params, char* err, size_t err_len,
                                  std::index_sequence<I...>) {
            int bad = -1;
            // The first pointer argument that is neither null nor inside a live allocation.
            ((bad < 0 && std::is_pointer<A>::value && *static_cast<void**>(params[I]) &&
                      !is_device_pointer(*static_cast<void**>(params[I]))
                  ? (void)(bad = (int)I)
                  : (void)0),
             ...);
            if (bad < 0) return 0;
            snprintf(err, err_len, "kernel %s: argument %d (%p) is not in any device allocation",
                     name, bad, *static_cast<void**>(params[bad]));
            return 1;
        }

        static int launch(const char* name, void** params, const Geometry& g, char* err,
                          size_t err_len) {
            if (check_pointers(name, params, err, err_len, std::index_sequence_for<A...>{}))
                return 1;
            return toolsift_emu_launch(name, g.grid, g.block, g.smem_bytes, g.seed, &body, params,
                                       err, err_len);
        }
    };
};

}  // namespace toolsift_emu_device

#define TOOLSIFT_EMU_ENTRY(f)                                                            \
    ::toolsift_emu_device::Entry {                                                       \
        #f, &::toolsift_emu_device::Launcher<decltype(&f)>::template For<&f>::launch \
    }

#define TOOLSIFT_EMU_ENTRIES(...)                                                         \
    namespace {                                                                           \
    const ::toolsift_emu_device::Entry toolsift_emu_entries[] = {__VA_ARGS__};            \
    const int toolsift_emu_registered = ::toolsift_emu_device::register_entries(          \
        toolsift_emu_entries, sizeof toolsift_emu_entries / sizeof toolsift_emu_entries[0]); \
    }
