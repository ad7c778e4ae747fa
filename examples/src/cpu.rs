//! What the machine was doing around a benchmark's rounds: CPU time from
//! `/proc/stat` (busy, idle and stolen shares) and the load average, so a
//! figure says whether it was measured on a quiet machine; and the
//! benchmark's own CPU time (`/proc/self/stat`), to tell its share from the
//! servers'.
//!
//! Every benchmark follows one convention ([`Watch`], [`Rounds`]): it reads
//! `/proc/stat` around each round, prints the round's busy, idle and steal
//! shares, marks a round whose steal was above [`STEAL_MARK`] per cent,
//! and ends with how many rounds were marked and its medians over all
//! rounds and over the unmarked ones.
//!
//! ```no_run
//! use idem_examples::cpu::{Rounds, Watch};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let mut rounds = Rounds::default();
//! let mut rates = Vec::new();
//! for round in 1..=5 {
//!     let watch = Watch::start()?;
//!     let rate = 1000.0; // run the round's variants
//!     let cpu = rounds.push(watch.stop()?);
//!     println!("round {round}: {rate:.0} msg/s ({cpu})");
//!     rates.push(rate);
//! }
//! println!("{}", rounds.summary());
//! println!("median {}", rounds.medians(&rates));
//! # Ok(()) }
//! ```

/// What reading `/proc` can fail with: an I/O error, which `?` turns into
/// whatever boxed error a benchmark's `main` returns.
type ProcResult<T> = std::io::Result<T>;

/// A `/proc` file that does not read as expected.
fn unexpected(what: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string())
}

/// The CPU's time so far, in clock ticks, from the `cpu` line of
/// `/proc/stat`: all of it, the busy part, and the stolen part.
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    total: u64,
    busy: u64,
    idle: u64,
    steal: u64,
}

impl Cpu {
    /// The counters now.
    pub fn now() -> ProcResult<Cpu> {
        let stat = std::fs::read_to_string("/proc/stat")?;
        let line = stat
            .lines()
            .next()
            .ok_or_else(|| unexpected("an empty /proc/stat"))?;
        let f: Vec<u64> = line
            .split_whitespace()
            .skip(1)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .map_err(unexpected)?;
        // user nice system idle iowait irq softirq steal (guest time is in user)
        let [user, nice, system, idle, iowait, irq, softirq, steal, ..] = f[..] else {
            return Err(unexpected("a short cpu line in /proc/stat"));
        };
        Ok(Cpu {
            total: user + nice + system + idle + iowait + irq + softirq + steal,
            busy: user + nice + system + irq + softirq,
            idle: idle + iowait,
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

    /// The busy, idle and stolen shares of the time since `before`.
    pub fn conditions_since(self, before: Cpu) -> Conditions {
        let total = (self.total - before.total).max(1) as f64;
        let share = |now: u64, then: u64| 100.0 * (now - then) as f64 / total;
        Conditions {
            busy: share(self.busy, before.busy),
            idle: share(self.idle, before.idle),
            steal: share(self.steal, before.steal),
        }
    }
}

/// Steal, in per cent of a round's CPU time, above which the round is
/// marked: the hypervisor gave the machine's cores to someone else for that
/// long, and every variant of the round ran on what was left.
pub const STEAL_MARK: f64 = 5.0;

/// What the machine's CPUs did during a round, in per cent of their time
/// (all processes, all cores): busy (user, system, interrupts), idle
/// (idle and waiting for I/O) and stolen by the hypervisor.
///
/// ```
/// use idem_examples::cpu::Conditions;
///
/// let quiet = Conditions { busy: 93.0, idle: 6.5, steal: 0.5 };
/// assert!(!quiet.marked());
/// assert_eq!(quiet.to_string(), "busy 93%, idle 6%, steal 0.5%");
/// let stolen = Conditions { busy: 70.0, idle: 18.0, steal: 12.0 };
/// assert!(stolen.marked());
/// assert_eq!(stolen.to_string(), "busy 70%, idle 18%, steal 12.0% STOLEN");
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Conditions {
    /// Busy share, per cent.
    pub busy: f64,
    /// Idle share (idle and I/O wait), per cent.
    pub idle: f64,
    /// Stolen share, per cent.
    pub steal: f64,
}

impl Conditions {
    /// Whether steal was above [`STEAL_MARK`].
    pub fn marked(&self) -> bool {
        self.steal > STEAL_MARK
    }
}

impl std::fmt::Display for Conditions {
    /// `busy 93%, idle 6%, steal 0.5%`, and ` STOLEN` after a marked round.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "busy {:.0}%, idle {:.0}%, steal {:.1}%{}",
            self.busy,
            self.idle,
            self.steal,
            if self.marked() { " STOLEN" } else { "" }
        )
    }
}

/// Reads `/proc/stat` when a round starts and when it stops.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// let watch = idem_examples::cpu::Watch::start()?;
/// // ... the round ...
/// let cpu = watch.stop()?;
/// println!("round 1: ... ({cpu})");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Watch {
    start: Cpu,
}

impl Watch {
    /// Starts watching.
    pub fn start() -> ProcResult<Watch> {
        Ok(Watch { start: Cpu::now()? })
    }

    /// What the CPUs did since [`start`](Self::start).
    pub fn stop(&self) -> ProcResult<Conditions> {
        Ok(Cpu::now()?.conditions_since(self.start))
    }
}

/// The conditions of a run's rounds, in order, and medians of per-round
/// samples over all of them and over the unmarked ones.
///
/// ```
/// use idem_examples::cpu::{Conditions, Rounds};
///
/// let mut rounds = Rounds::default();
/// for steal in [0.5_f64, 12.0, 1.0] {
///     rounds.push(Conditions { busy: 90.0, idle: 10.0 - steal.min(10.0), steal });
/// }
/// assert_eq!(rounds.marked(), 1);
/// let rates = [100.0, 40.0, 110.0];
/// assert_eq!(rounds.median(&rates), 100.0);
/// assert_eq!(rounds.quiet_median(&rates), Some(110.0));
/// assert_eq!(rounds.medians(&rates).to_string(), "100 (unmarked 110)");
/// assert!(rounds.summary().starts_with("3 rounds, 1 marked (steal above 5%)"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct Rounds {
    seen: Vec<Conditions>,
}

impl Rounds {
    /// Adds the next round's conditions, and answers them (to print).
    pub fn push(&mut self, conditions: Conditions) -> Conditions {
        self.seen.push(conditions);
        conditions
    }

    /// The rounds' conditions, in order.
    pub fn conditions(&self) -> &[Conditions] {
        &self.seen
    }

    /// How many rounds were marked.
    pub fn marked(&self) -> usize {
        self.seen.iter().filter(|c| c.marked()).count()
    }

    /// The median of `samples`, one per round in order.
    pub fn median(&self, samples: &[f64]) -> f64 {
        crate::median(samples.to_vec())
    }

    /// The median of `samples` (one per round, in order) over the rounds
    /// that were not marked; `None` when every round was.
    pub fn quiet_median(&self, samples: &[f64]) -> Option<f64> {
        let quiet: Vec<f64> = samples
            .iter()
            .zip(&self.seen)
            .filter(|(_, c)| !c.marked())
            .map(|(s, _)| *s)
            .collect();
        (!quiet.is_empty()).then(|| crate::median(quiet))
    }

    /// Both medians of `samples`, printed as `100 (unmarked 110)`, or
    /// `100 (unmarked: none)`.
    pub fn medians(&self, samples: &[f64]) -> Medians {
        Medians {
            all: self.median(samples),
            quiet: self.quiet_median(samples),
        }
    }

    /// `5 rounds, 1 marked (steal above 5%); busy 88-100%, idle 0-12%,
    /// steal 0.4-7.9%`.
    pub fn summary(&self) -> String {
        let range = |f: fn(&Conditions) -> f64| {
            let min = self.seen.iter().map(f).fold(f64::INFINITY, f64::min);
            let max = self.seen.iter().map(f).fold(f64::NEG_INFINITY, f64::max);
            (min, max)
        };
        let (busy, idle, steal) = (range(|c| c.busy), range(|c| c.idle), range(|c| c.steal));
        format!(
            "{} rounds, {} marked (steal above {STEAL_MARK:.0}%); busy {:.0}-{:.0}%, idle {:.0}-{:.0}%, steal {:.1}-{:.1}%",
            self.seen.len(),
            self.marked(),
            busy.0,
            busy.1,
            idle.0,
            idle.1,
            steal.0,
            steal.1
        )
    }
}

/// A median over all rounds and one over the unmarked rounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Medians {
    /// Over every round.
    pub all: f64,
    /// Over the unmarked rounds; `None` when every round was marked.
    pub quiet: Option<f64>,
}

impl Medians {
    /// The ratio of these medians to `base`'s, over all rounds and over
    /// the unmarked ones.
    pub fn ratio(&self, base: &Medians) -> Medians {
        Medians {
            all: self.all / base.all,
            quiet: self.quiet.zip(base.quiet).map(|(a, b)| a / b),
        }
    }

    /// The median over unmarked rounds when there is one, else over all.
    pub fn best(&self) -> f64 {
        self.quiet.unwrap_or(self.all)
    }
}

impl std::fmt::Display for Medians {
    /// The numbers with the formatter's precision (none given: whole).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let p = f.precision().unwrap_or(0);
        match self.quiet {
            Some(q) => write!(f, "{:.p$} (unmarked {q:.p$})", self.all),
            None => write!(f, "{:.p$} (unmarked: none)", self.all),
        }
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
pub fn process_seconds() -> ProcResult<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command's `(name)`: state is field 3, utime 14, stime 15.
    let (_, rest) = stat
        .rsplit_once(')')
        .ok_or_else(|| unexpected("no command in /proc/self/stat"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (Some(utime), Some(stime)) = (fields.get(11), fields.get(12)) else {
        return Err(unexpected("a short /proc/self/stat"));
    };
    let ticks =
        utime.parse::<u64>().map_err(unexpected)? + stime.parse::<u64>().map_err(unexpected)?;
    Ok(ticks as f64 / clock_ticks())
}

/// The CPU time so far (user + system, in seconds) of the processes
/// `pids`, from `/proc/<pid>/stat`: a server's share of a round, counted
/// on the processes that serve the benchmark (PostgreSQL's backends of the
/// benchmark's own connections, as `pg_backend_pid()` names them), not on
/// those that serve other clients of the same server. A process that ended
/// counts nothing, so take the difference over a span in which they live
/// on (a pool's connections that stay open).
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
/// use idem_examples::cpu::pids_seconds;
///
/// // A server's processes: PostgreSQL's backends, say, each connection's
/// // `SELECT pg_backend_pid()`; here, this process.
/// let pids = [std::process::id()];
/// let before = pids_seconds(&pids)?;
/// let _work: u64 = (0..1_000_000u64).sum();
/// assert!(pids_seconds(&pids)? >= before);
/// # Ok(()) }
/// ```
pub fn pids_seconds(pids: &[u32]) -> ProcResult<f64> {
    let mut ticks = 0u64;
    for pid in pids {
        // A process may have ended: it counts nothing.
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if let (Some(utime), Some(stime)) = (fields.get(11), fields.get(12)) {
            ticks += utime.parse::<u64>().map_err(unexpected)?
                + stime.parse::<u64>().map_err(unexpected)?;
        }
    }
    Ok(ticks as f64 / clock_ticks())
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
