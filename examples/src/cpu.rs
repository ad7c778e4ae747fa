//! What the machine was doing around a benchmark's rounds: CPU time from
//! `/proc/stat` (busy and stolen shares) and the load average, so a figure
//! says whether it was measured on a quiet machine; and the benchmark's own
//! CPU time (`/proc/self/stat`), to tell its share from the servers'.

/// A boxed error, as the benchmarks return.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The CPU's time so far, in clock ticks, from the `cpu` line of
/// `/proc/stat`: all of it, the busy part, and the stolen part.
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    total: u64,
    busy: u64,
    steal: u64,
}

impl Cpu {
    /// The counters now.
    pub fn now() -> Result<Cpu, BoxError> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let line = stat.lines().next().ok_or("an empty /proc/stat")?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()?;
        // user nice system idle iowait irq softirq steal (guest time is in user)
        let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = f[..] else {
            return Err("a short cpu line in /proc/stat".into());
        };
        Ok(Cpu {
            total: user + nice + system + idle + iowait + irq + softirq + steal,
            busy: user + nice + system + irq + softirq,
            steal,
        })
    }

    /// The busy and stolen shares of the time since `before`, in percent.
    pub fn since(self, before: Cpu) -> (f64, f64) {
        let total = (self.total - before.total).max(1) as f64;
        (
            100.0 * (self.busy - before.busy) as f64 / total,
            100.0 * (self.steal - before.steal) as f64 / total,
        )
    }
}

/// The 1-, 5- and 15-minute load averages, or `unknown`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

impl Cpu {
    /// The busy CPU time since `before`, all cores together, in seconds.
    pub fn busy_seconds_since(self, before: Cpu) -> f64 {
        (self.busy - before.busy) as f64 / clock_ticks()
    }
}

/// This process's CPU time so far (user + system, from `/proc/self/stat`),
/// in seconds.
pub fn process_seconds() -> Result<f64, BoxError> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command's `(name)`: state is field 3, utime 14, stime 15.
    let (_, rest) = stat
        .rsplit_once(')')
        .ok_or("no command in /proc/self/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (Some(utime), Some(stime)) = (fields.get(11), fields.get(12)) else {
        return Err("a short /proc/self/stat".into());
    };
    Ok((utime.parse::<u64>()? + stime.parse::<u64>()?) as f64 / clock_ticks())
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
pub fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}
