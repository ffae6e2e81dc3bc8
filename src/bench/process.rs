//! Probes of processes for `denorm bench`, from /proc: CPU time per phase,
//! peak memory, the machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

/// CPU seconds (user + system) process `pid` has used, from /proc.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz)
}

/// CPU time of the processes of a phase, against its wall time.
pub struct CpuClock {
    pids: Vec<(&'static str, u32)>,
    start: Vec<Option<f64>>,
    wall: Instant,
}

impl CpuClock {
    pub fn start(pids: Vec<(&'static str, u32)>) -> CpuClock {
        let start = pids.iter().map(|(_, p)| cpu_seconds(*p)).collect();
        CpuClock { pids, start, wall: Instant::now() }
    }

    /// {"wall_seconds", "<name>_cpu_seconds"...}; also printed.
    pub fn stop(&self, phase: &str) -> serde_json::Value {
        let wall = self.wall.elapsed().as_secs_f64();
        let mut out = serde_json::Map::new();
        out.insert("wall_seconds".into(), json!(wall));
        let mut text = Vec::new();
        for ((name, pid), start) in self.pids.iter().zip(&self.start) {
            if let (Some(a), Some(b)) = (*start, cpu_seconds(*pid)) {
                out.insert(format!("{name}_cpu_seconds"), json!(b - a));
                text.push(format!("{name} {:.1} s", b - a));
            }
        }
        eprintln!("       cpu during {phase}: {} in {wall:.1} s wall on {} cores", text.join(", "), std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
        serde_json::Value::Object(out)
    }
}

/// A figure of a `/proc/<pid>/status` text, in kB.
fn status_value(status: &str, key: &str) -> Option<u64> {
    status.lines().find(|l| l.starts_with(key))?.split_whitespace().nth(1)?.parse().ok()
}

/// Peak memory sampling of a worker (see [`Worker::sample_peaks`]).
pub struct Sampler {
    stop: Arc<AtomicBool>,
    join: std::thread::JoinHandle<(u64, u64)>,
}

impl Sampler {
    /// Samples process `pid`'s anonymous and file-backed resident memory
    /// every 10 ms until stopped.
    pub fn start(pid: u32) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let join = std::thread::spawn(move || {
            let (mut anon, mut file) = (0, 0);
            loop {
                let done = flag.load(Ordering::SeqCst);
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                anon = anon.max(status_value(&status, "RssAnon:").unwrap_or(0));
                file = file.max(status_value(&status, "RssFile:").unwrap_or(0));
                if done {
                    return (anon, file);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Sampler { stop, join }
    }

    /// Peak (RssAnon, RssFile) in kB.
    pub fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.join.join().unwrap_or((0, 0))
    }
}

pub fn machine() -> serde_json::Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| s.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split(':').nth(1)).map(|m| m.trim().to_string()));
    let mem_kb = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| s.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|v| v.parse::<u64>().ok()));
    json!({
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "cpu": cpu,
        "memory_gib": mem_kb.map(|k| (k as f64 / 1048576.0 * 10.0).round() / 10.0),
    })
}

/// A `/proc/<pid>/status` figure of process `pid` in kB (VmRSS, VmHWM).
pub fn status_kb(pid: u32, key: &str) -> Option<u64> {
    status_value(&std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_cpu_time_and_resident_memory() {
        let pid = std::process::id();
        let clock = CpuClock::start(vec![("self", pid)]);
        // Busy until the kernel has counted some of it (ticks of 10 ms).
        let before = cpu_seconds(pid).expect("this process's CPU time");
        let until = Instant::now() + Duration::from_secs(10);
        while cpu_seconds(pid).unwrap() <= before && Instant::now() < until {
            std::hint::black_box((0..100_000u64).map(std::hint::black_box).sum::<u64>());
        }
        let v = clock.stop("a test");
        assert!(v["self_cpu_seconds"].as_f64().is_some_and(|s| s > 0.0), "{v}");
        assert!(status_kb(pid, "VmRSS:").is_some_and(|kb| kb > 0));
        let (anon, _) = Sampler::start(pid).stop();
        assert!(anon > 0);
        assert!(machine()["cpus"].as_u64().is_some_and(|n| n >= 1));
    }
}
