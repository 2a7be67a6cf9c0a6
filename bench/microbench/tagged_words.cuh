// The round-trip microbenchmarks' tagged words (host_roundtrip.cu, tail_roundtrip.cu): 64-bit
// words (trip << 32) | payload, loaded and stored volatile, as the resident kernel's frames and
// tagged outputs are.
#pragma once

static const unsigned long long POLL_LIMIT = 1ull << 30;  // a lost word ends the kernel, not the machine

__device__ __forceinline__ unsigned long long ld_volatile(const unsigned long long* p) {
    unsigned long long w;
    asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
    return w;
}
__device__ __forceinline__ void st_volatile(unsigned long long* p, unsigned long long v) {
    asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
// polls *p until its high half is trip i (the word into *w); false after POLL_LIMIT polls (lost)
__device__ __forceinline__ bool poll_word(const unsigned long long* p, unsigned i, unsigned long long* w) {
    for (unsigned long long polls = 0; polls <= POLL_LIMIT; ++polls)
        if ((unsigned)((*w = ld_volatile(p)) >> 32) == i) return true;
    return false;
}
