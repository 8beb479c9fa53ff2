// The host emulator's runtime (see cuda_emu.h): launches, fibers, barriers, shuffles, and
// guarded buffers whose out-of-bounds accesses stop the process with a message naming the
// kernel, block, thread and buffer.
//
// C API (src/emu.rs):
//   toolsift_emu_launch  run body(ctx) as every thread of a grid; 0, or 1 with a message
//   toolsift_emu_alloc   bytes ending flush against a PROT_NONE page once rounded up to 16
//                        (the alignment); the padding is a canary every launch checks, and so
//                        are the 16 bytes before the start (the rest of that page reads NaN;
//                        a PROT_NONE page lies before it)
//   toolsift_emu_free
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <string>
#include <vector>

#include "cuda_emu.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace toolsift_emu {
namespace {

constexpr size_t STACK_BYTES = 128 * 1024;

size_t page_size() {
    static const size_t p = (size_t)sysconf(_SC_PAGESIZE);
    return p;
}

size_t round_up(size_t v, size_t to) { return (v + to - 1) / to * to; }

// ---- guarded memory --------------------------------------------------------------------------

struct Mapping {
    unsigned char* base;  // mmap'd region: data pages, then one PROT_NONE page
    size_t length;
    unsigned char* data;
    size_t bytes;
    std::string label;
};

std::mutex g_mappings_lock;
std::vector<Mapping> g_mappings;

// The padding between a buffer's end and its guard page holds this byte: all ones, a NaN in
// f32, bf16 and f16, so a kernel that reads it poisons its result, and one that writes it is
// caught by `check_padding` after the launch.
constexpr unsigned char CANARY = 0xFF;

// `bytes` (rounded up to `align`, a power of two up to a page) between two PROT_NONE pages,
// ending at the second: reading or writing past the rounded end faults; the padding up to it is
// CANARY, and so is the rest of the page the buffer starts in (a read just before the start
// gives NaN, and a write there within FRONT_CHECK bytes fails the launch); before that page, or
// just before a buffer that starts a page, the first guard page faults.
Mapping map_guarded(size_t bytes, const char* label, size_t align = 16) {
    const size_t page = page_size(), span = round_up(round_up(bytes, align), page);
    void* base = mmap(nullptr, span + 2 * page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return Mapping{nullptr, 0, nullptr, 0, label};
    unsigned char* b = static_cast<unsigned char*>(base);
    mprotect(b, page, PROT_NONE);
    mprotect(b + page + span, page, PROT_NONE);
    unsigned char* data = b + page + span - round_up(bytes, align);
    memset(data + bytes, CANARY, round_up(bytes, align) - bytes);
    memset(b + page, CANARY, data - (b + page));
    return Mapping{b, span + 2 * page, data, bytes, label};
}

// Bytes before a buffer's start that every launch checks for writes (up to its first page).
constexpr size_t FRONT_CHECK = 16;

// The first mapping whose padding a write changed (the write stayed short of the guard page), or
// whose FRONT_CHECK bytes before the start it did, as an error message naming the buffer, or ""
// when every padding holds. The padding is restored, so that a later launch (another test's, in
// the same process) is not blamed for it.
std::string check_padding(const char* kernel) {
    std::lock_guard<std::mutex> lock(g_mappings_lock);
    for (const Mapping& m : g_mappings) {
        const size_t room = m.data - (m.base + page_size());
        const size_t front = room < FRONT_CHECK ? room : FRONT_CHECK;
        for (unsigned char* p = m.data - front; p < m.data; ++p)
            if (*p != CANARY) {
                const size_t at = m.data - p;
                memset(m.data - front, CANARY, front);
                return std::string("kernel ") + kernel + " wrote before the start of buffer \"" +
                       m.label + "\" (" + std::to_string(m.bytes) + " bytes), at byte " +
                       std::to_string(at) + " before it";
            }
        unsigned char* end = m.base + m.length - page_size();
        for (unsigned char* p = m.data + m.bytes; p < end; ++p)
            if (*p != CANARY) {
                const size_t at = p - (m.data + m.bytes);
                memset(m.data + m.bytes, CANARY, end - (m.data + m.bytes));
                return std::string("kernel ") + kernel + " wrote past the end of buffer \"" +
                       m.label + "\" (" + std::to_string(m.bytes) + " bytes), at byte " +
                       std::to_string(at) + " of its alignment padding";
            }
    }
    return "";
}

// ---- fibers ----------------------------------------------------------------------------------

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack, stores
// the stack pointer in *save, and resumes the context whose stack pointer is `next`.
extern "C" void toolsift_emu_switch(void** save, void* next);
asm(R"(
    .text
    .globl toolsift_emu_switch
    .type toolsift_emu_switch,@function
toolsift_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size toolsift_emu_switch, .-toolsift_emu_switch
)");
#endif

struct Fiber {
    dim3 tid;
    int linear = 0, warp = 0, lane = 0;
    State state = State::Ready;
    int shuffle_parity = 0;
    int gather_parity = 0;
    unsigned char* stack = nullptr;  // STACK_BYTES above one PROT_NONE page
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

struct Warp {
    uint64_t slots[2][32];
    unsigned char gathered[2][32][32];
    int lanes = 0;
};

struct Launch {
    const char* name = "";
    dim3 grid, block, bid;
    void (*body)(void*) = nullptr;
    void* ctx = nullptr;
    std::vector<Fiber> fibers;
    std::vector<Warp> warps;
    Fiber* current = nullptr;
    Mapping smem{};
    std::string error;
#if defined(__x86_64__)
    void* scheduler_sp = nullptr;
#else
    ucontext_t scheduler_uc;
#endif
};

// The static __shared__ arrays of every kernel (cuda_emu.h), bounds from the linker.
extern "C" unsigned char __start_toolsift_emu_shared[] __attribute__((weak));
extern "C" unsigned char __stop_toolsift_emu_shared[] __attribute__((weak));

std::mutex g_launch_lock;
Launch* g = nullptr;  // the running launch (one at a time: g_launch_lock)
std::vector<unsigned char*> g_stacks;  // reused across launches

void to_scheduler() {
    Fiber* f = g->current;
#if defined(__x86_64__)
    toolsift_emu_switch(&f->sp, g->scheduler_sp);
#else
    swapcontext(&f->uc, &g->scheduler_uc);
#endif
}

void run_fiber(Fiber* f) {
    g->current = f;
#if defined(__x86_64__)
    toolsift_emu_switch(&g->scheduler_sp, f->sp);
#else
    swapcontext(&g->scheduler_uc, &f->uc);
#endif
    g->current = nullptr;
}

void fiber_main() {
    g->body(g->ctx);
    g->current->state = State::Done;
    to_scheduler();
    abort();  // a finished fiber is never resumed
}

void start_fiber(Fiber* f) {
#if defined(__x86_64__)
    // The frame toolsift_emu_switch pops: control words, r15..r12, rbx, rbp, then the return
    // address (fiber_main), placed so that fiber_main starts with rsp = 8 (mod 16) like a call.
    uintptr_t top = reinterpret_cast<uintptr_t>(f->stack + STACK_BYTES) & ~uintptr_t(15);
    uint64_t* frame = reinterpret_cast<uint64_t*>(top - 16 - 7 * 8);
    uint32_t mxcsr = 0x1F80;
    uint16_t fpucw = 0x037F;
    memset(frame, 0, 8 * 9);
    memcpy(frame, &mxcsr, 4);
    memcpy(reinterpret_cast<unsigned char*>(frame) + 4, &fpucw, 2);
    frame[7] = reinterpret_cast<uint64_t>(&fiber_main);
    f->sp = frame;
#else
    getcontext(&f->uc);
    f->uc.uc_stack.ss_sp = f->stack;
    f->uc.uc_stack.ss_size = STACK_BYTES;
    f->uc.uc_link = nullptr;
    makecontext(&f->uc, fiber_main, 0);
#endif
}

bool ensure_stacks(size_t n) {
    const size_t page = page_size();
    while (g_stacks.size() < n) {
        void* m = mmap(nullptr, STACK_BYTES + page, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) return false;
        unsigned char* b = static_cast<unsigned char*>(m);
        mprotect(b, page, PROT_NONE);  // stacks grow down: overflow hits this page
        g_stacks.push_back(b + page);
    }
    return true;
}

void wait(State s) {
    g->current->state = s;
    to_scheduler();
}

// ---- the fault reporter ----------------------------------------------------------------------

struct sigaction g_old_segv, g_old_bus;
stack_t g_old_altstack;
std::vector<unsigned char> g_altstack(64 * 1024);

void on_fault(int sig, siginfo_t* info, void*) {
    char msg[1024];
    const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const char* what = "an address outside every emulator buffer";
    char buf[320] = {0};
    for (const Mapping& m : g_mappings) {
        const uintptr_t front = reinterpret_cast<uintptr_t>(m.base);
        const uintptr_t guard = front + m.length - page_size();
        if (addr >= guard && addr < guard + page_size()) {
            snprintf(buf, sizeof buf, "%zu bytes past the end of buffer \"%s\" (%zu bytes)",
                     (size_t)(addr - reinterpret_cast<uintptr_t>(m.data)) - m.bytes,
                     m.label.c_str(), m.bytes);
            what = buf;
        }
        if (addr >= front && addr < front + page_size()) {
            snprintf(buf, sizeof buf, "%zu bytes before the start of buffer \"%s\" (%zu bytes)",
                     (size_t)(reinterpret_cast<uintptr_t>(m.data) - addr), m.label.c_str(),
                     m.bytes);
            what = buf;
        }
    }
    for (unsigned char* s : g_stacks)
        if (addr >= reinterpret_cast<uintptr_t>(s) - page_size() &&
            addr < reinterpret_cast<uintptr_t>(s))
            what = "a thread's stack guard (stack overflow)";
    // x86-64 raises a general-protection fault, reported as SI_KERNEL with no address, for an
    // aligned 16-byte move off a 16-byte boundary and for a pointer outside the address space.
    if (sig == SIGSEGV && info->si_code == SI_KERNEL)
        what = "not reported: a general-protection fault (an aligned 16-byte access off a "
               "16-byte boundary, or an address far outside memory)";
    if (g && g->current) {
        const Fiber* f = g->current;
        snprintf(msg, sizeof msg,
                 "toolsift-emu: %s in kernel %s, block (%u, %u, %u), thread (%u, %u, %u): "
                 "address %p is %s\n",
                 sig == SIGSEGV ? "invalid memory access" : "bus error", g->name, g->bid.x,
                 g->bid.y, g->bid.z, f->tid.x, f->tid.y, f->tid.z, info->si_addr, what);
    } else {
        snprintf(msg, sizeof msg, "toolsift-emu: fault at %p during a launch (%s)\n",
                 info->si_addr, what);
    }
    ssize_t ignored = write(2, msg, strlen(msg));
    (void)ignored;
    signal(SIGABRT, SIG_DFL);
    abort();
}

void install_fault_reporter() {
    stack_t ss{};
    ss.ss_sp = g_altstack.data();
    ss.ss_size = g_altstack.size();
    sigaltstack(&ss, &g_old_altstack);
    struct sigaction sa {};
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    sigaction(SIGBUS, &sa, &g_old_bus);
}

void remove_fault_reporter() {
    sigaction(SIGSEGV, &g_old_segv, nullptr);
    sigaction(SIGBUS, &g_old_bus, nullptr);
    sigaltstack(&g_old_altstack, nullptr);
}

// ---- scheduling ------------------------------------------------------------------------------

struct Rng {
    uint64_t s;
    uint64_t next() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        return s;
    }
};

// Between two __syncthreads a GPU may run one warp far ahead of another: many warp barriers
// (shuffles) ahead, into the next phase's first writes of shared memory. Rounds alone never
// show that (every warp goes one warp barrier per round), so with a nonzero seed each warp sits
// out the first 1..=MAX_HOLD rounds of a barrier phase with odds 1 in HOLD_ODDS: a read of
// scratch that a fast warp rewrites before the next __syncthreads (block_sum called twice
// without its trailing barrier) then shows as a seed-dependent result. MAX_HOLD covers two
// warp_sums (ten shuffles) and the code between them.
constexpr uint64_t HOLD_ODDS = 4;
constexpr uint64_t MAX_HOLD = 32;

// Why no fiber of the block can go on, for the error message.
std::string describe_stall() {
    std::string out;
    for (size_t w = 0; w < g->warps.size(); ++w) {
        int at_block = 0, at_warp = 0, done = 0;
        for (const Fiber& f : g->fibers) {
            if (f.warp != (int)w) continue;
            at_block += f.state == State::AtBlockBarrier;
            at_warp += f.state == State::AtWarpBarrier;
            done += f.state == State::Done;
        }
        char line[160];
        snprintf(line, sizeof line, "; warp %zu: %d at __syncthreads, %d at a warp barrier, %d exited",
                 w, at_block, at_warp, done);
        out += line;
    }
    return out;
}

// Runs one block to completion; false (g->error set) on an error.
bool run_block(uint64_t seed) {
    const size_t n = g->fibers.size();
    for (Fiber& f : g->fibers) {
        f.state = State::Ready;
        f.shuffle_parity = 0;
        f.gather_parity = 0;
        start_fiber(&f);
    }
    memset(g->smem.data, 0xFF, g->smem.bytes);
    if (__start_toolsift_emu_shared && __stop_toolsift_emu_shared)
        memset(__start_toolsift_emu_shared, 0xFF,
               (size_t)(__stop_toolsift_emu_shared - __start_toolsift_emu_shared));
    // Seeded by the block's index in the grid, so that no two blocks of a launch share an order
    // (x + 65536 y, as before, gave blocks that differ only in z one order, and x past 65535
    // the order of a block in the next row).
    const uint64_t block_index =
        g->bid.x + (uint64_t)g->grid.x * (g->bid.y + (uint64_t)g->grid.y * g->bid.z);
    Rng rng{(seed ^ (0x9E3779B97F4A7C15ull * (1 + block_index))) | 1};
    std::vector<size_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = i;
    // Rounds each warp still sits out, drawn at the start of every barrier phase (see HOLD_ODDS).
    std::vector<int> hold(g->warps.size(), 0);
    auto draw_holds = [&] {
        if (seed == 0) return;
        for (int& h : hold) h = rng.next() % HOLD_ODDS == 0 ? 1 + (int)(rng.next() % MAX_HOLD) : 0;
    };
    draw_holds();
    for (;;) {
        if (seed != 0)
            for (size_t i = n; i > 1; --i) std::swap(order[i - 1], order[rng.next() % i]);
        // A held warp sits out only while another can run: once every warp that can go on is
        // held, the holds end, so holding never makes a barrier wait for ever.
        bool unheld_ready = false;
        for (const Fiber& f : g->fibers)
            unheld_ready |= f.state == State::Ready && hold[f.warp] == 0;
        if (!unheld_ready) std::fill(hold.begin(), hold.end(), 0);
        for (size_t i : order) {
            if (g->fibers[i].state != State::Ready || hold[g->fibers[i].warp] > 0) continue;
            run_fiber(&g->fibers[i]);
            if (!g->error.empty()) return false;
        }
        for (int& h : hold) h -= h > 0;
        bool any_live = false, released = false;
        for (size_t w = 0; w < g->warps.size(); ++w) {
            int waiting = 0, other = 0;
            for (const Fiber& f : g->fibers)
                if (f.warp == (int)w) (f.state == State::AtWarpBarrier ? waiting : other) += 1;
            if (waiting > 0 && other == 0) {
                for (Fiber& f : g->fibers)
                    if (f.warp == (int)w) f.state = State::Ready;
                released = true;
            }
        }
        int live = 0, at_block = 0, ready = 0;  // ready: a released warp, or one still held
        for (const Fiber& f : g->fibers) {
            live += f.state != State::Done;
            at_block += f.state == State::AtBlockBarrier;
            ready += f.state == State::Ready;
        }
        any_live = live > 0;
        if (!any_live) return true;
        if (released || ready > 0) continue;
        if (at_block == live) {
            // The device leaves a __syncthreads that some threads never reach undefined, exited
            // ones included (early returns must be block-uniform).
            if (live < (int)n) {
                char head[240];
                snprintf(head, sizeof head,
                         "kernel %s, block (%u, %u, %u): __syncthreads after %d of its %zu threads "
                         "exited (undefined on the device)",
                         g->name, g->bid.x, g->bid.y, g->bid.z, (int)n - live, n);
                g->error = head;
                return false;
            }
            for (Fiber& f : g->fibers)
                if (f.state == State::AtBlockBarrier) f.state = State::Ready;
            draw_holds();
            continue;
        }
        char head[200];
        snprintf(head, sizeof head, "kernel %s, block (%u, %u, %u): barrier can never complete",
                 g->name, g->bid.x, g->bid.y, g->bid.z);
        g->error = head + describe_stall();
        return false;
    }
}

}  // namespace

// ---- the device-side API (cuda_emu.h) ----------------------------------------------------------

const dim3& thread_idx() { return g->current->tid; }
const dim3& block_idx() { return g->bid; }
const dim3& block_dim() { return g->block; }
const dim3& grid_dim() { return g->grid; }
int lane_id() { return g->current->lane; }
unsigned char* dynamic_shared() { return g->smem.data; }

void sync_block() { wait(State::AtBlockBarrier); }

void sync_warp() { wait(State::AtWarpBarrier); }

uint64_t shuffle(uint64_t value, int src_lane) {
    Fiber* f = g->current;
    Warp& w = g->warps[f->warp];
    // A full-mask shuffle names lanes a partial warp does not have: undefined on the device.
    if (w.lanes != 32) unsupported("a warp shuffle in a partial warp (blockDim not a multiple of 32)");
    // Two slot sets used alternately: a lane can only come back to this set after every lane
    // passed the next shuffle's barrier, i.e. after all of them read this one.
    const int p = f->shuffle_parity;
    f->shuffle_parity ^= 1;
    w.slots[p][f->lane] = value;
    sync_warp();
    return src_lane >= 0 && src_lane < w.lanes ? w.slots[p][src_lane] : value;
}

void warp_gather(const void* mine, void* all, size_t bytes) {
    if (bytes > 32) unsupported("warp_gather of more than 32 bytes per lane");
    Fiber* f = g->current;
    Warp& w = g->warps[f->warp];
    if (w.lanes != 32) unsupported("warp_gather in a partial warp");
    // Alternating buffers, as for shuffles.
    const int p = f->gather_parity;
    f->gather_parity ^= 1;
    memcpy(w.gathered[p][f->lane], mine, bytes);
    sync_warp();
    for (int l = 0; l < 32; ++l)
        memcpy(static_cast<unsigned char*>(all) + l * bytes, w.gathered[p][l], bytes);
}

void unsupported(const char* what) {
    g->error = std::string("kernel ") + g->name + ": not supported by the emulator: " + what;
    to_scheduler();
    abort();
}

}  // namespace toolsift_emu

using namespace toolsift_emu;

extern "C" void* toolsift_emu_alloc(size_t bytes, const char* label) {
    Mapping m = map_guarded(bytes, label);
    if (!m.base) return nullptr;
    std::lock_guard<std::mutex> lock(g_mappings_lock);
    g_mappings.push_back(m);
    return m.data;
}

extern "C" void toolsift_emu_free(void* data) {
    std::lock_guard<std::mutex> lock(g_mappings_lock);
    for (size_t i = 0; i < g_mappings.size(); ++i) {
        if (g_mappings[i].data == data) {
            munmap(g_mappings[i].base, g_mappings[i].length);
            g_mappings.erase(g_mappings.begin() + i);
            return;
        }
    }
}

extern "C" int toolsift_emu_launch(const char* name, const unsigned grid[3],
                                   const unsigned block[3], size_t smem_bytes, uint64_t seed,
                                   void (*body)(void*), void* ctx, char* err, size_t err_len) {
    auto fail = [&](const std::string& msg) {
        snprintf(err, err_len, "%s", msg.c_str());
        return 1;
    };
    // What fails before the kernel runs says which kernel, as the kernel's own errors do.
    auto refuse = [&](const std::string& why) {
        return fail(std::string("kernel ") + name + ": " + why);
    };
    const size_t threads = (size_t)block[0] * block[1] * block[2];
    if (threads == 0 || threads > 1024)
        return refuse("block of " + std::to_string(threads) + " threads (1..=1024)");
    if ((size_t)grid[0] * grid[1] * grid[2] == 0) return 0;
    std::lock_guard<std::mutex> launch_lock(g_launch_lock);
    if (!ensure_stacks(threads)) return refuse("cannot map the emulator's thread stacks");
    Launch launch;
    launch.name = name;
    launch.grid = dim3{grid[0], grid[1], grid[2]};
    launch.block = dim3{block[0], block[1], block[2]};
    launch.body = body;
    launch.ctx = ctx;
    // 128-byte aligned, like the kernels' `extern __shared__ __align__(128)` on the device.
    launch.smem = map_guarded(smem_bytes, "dynamic shared memory", 128);
    if (!launch.smem.base) return refuse("cannot map the emulator's shared memory");
    {
        std::lock_guard<std::mutex> lock(g_mappings_lock);
        g_mappings.push_back(launch.smem);
    }
    launch.fibers.resize(threads);
    launch.warps.resize((threads + 31) / 32);
    for (size_t i = 0; i < threads; ++i) {
        Fiber& f = launch.fibers[i];
        f.linear = (int)i;
        f.tid = dim3{(unsigned)(i % block[0]), (unsigned)(i / block[0] % block[1]),
                     (unsigned)(i / ((size_t)block[0] * block[1]))};
        f.warp = (int)(i / 32);
        f.lane = (int)(i % 32);
        f.stack = g_stacks[i];
        launch.warps[f.warp].lanes += 1;
    }
    g = &launch;
    install_fault_reporter();
    bool ok = true;
    for (unsigned z = 0; ok && z < grid[2]; ++z)
        for (unsigned y = 0; ok && y < grid[1]; ++y)
            for (unsigned x = 0; ok && x < grid[0]; ++x) {
                launch.bid = dim3{x, y, z};
                ok = run_block(seed);
            }
    remove_fault_reporter();
    g = nullptr;
    // Before the shared memory is unmapped: its padding is checked too.
    const std::string overrun = ok ? check_padding(name) : "";
    toolsift_emu_free(launch.smem.data);
    if (!ok) return fail(launch.error);
    return overrun.empty() ? 0 : fail(overrun);
}
