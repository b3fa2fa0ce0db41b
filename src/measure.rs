//! Process figures for the benchmarks: CPU time and resident memory of
//! this process, read from the operating system.

/// Process CPU time (user + system, every thread), from `getrusage`, in µs;
/// 0 when the call fails.
pub fn cpu_micros() -> u64 {
    // SAFETY: `getrusage` writes the whole struct it is given and reads
    // nothing else; a zeroed `rusage` is a valid value of it.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) != 0 {
            return 0;
        }
        usage
    };
    let micros = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    micros(usage.ru_utime) + micros(usage.ru_stime)
}

/// Resident set size, from /proc/self/status, in KiB; 0 where there is no
/// such file.
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
