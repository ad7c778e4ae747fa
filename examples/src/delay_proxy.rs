//! A TCP proxy that adds a fixed one-way delay, for benchmarks that must see
//! the round trips a database across a network costs.
//!
//! [`DelayProxy::start`] listens on `127.0.0.1:0` and forwards every accepted
//! connection to an upstream address. Each direction of each connection has
//! a reader thread and a writer thread on blocking sockets: the reader stamps
//! every chunk it reads with `read time + delay` and queues it; the writer
//! sleeps until a chunk's deadline and writes it. A chunk read at `t` is
//! written at `t + delay` while later chunks are already being read, so the
//! proxy delays traffic without serialising it: pipelined requests stay
//! pipelined, and throughput is not one chunk per delay.
//!
//! tokio's timer has a 1 ms granularity, too coarse for delays of a few
//! hundred microseconds. The writer instead lowers its own timer slack to
//! 1 ns (Linux's default of 50 µs would make every sleep that much late;
//! see [`precise_timers`]) and sleeps with [`std::thread::sleep`] until
//! the deadline. It does not spin: on a machine whose cores the database
//! and the consumers share, spinning writers (one per direction of each
//! connection) would take CPU from them, which a real network does not.
//! `TCP_NODELAY` is set on both sides.
//!
//! The proxy costs a little of its own on top of the delay: the reader
//! thread wakes some microseconds after the bytes arrive, and the writer
//! some after its deadline (together 20–40 µs each way on a 2-core VM).
//! [`own_latency`] measures it and [`DelayProxy::start_compensated`]
//! subtracts it from the delay, so that a round trip costs twice the delay
//! more, not twice the delay and two hops. [`added_round_trip`] measures
//! what a proxy adds to a ping-pong, to check its precision on the machine
//! at hand.
//!
//! ```
//! use std::io::{Read, Write};
//! use std::net::{TcpListener, TcpStream};
//! use std::time::{Duration, Instant};
//!
//! use idem_examples::delay_proxy::DelayProxy;
//!
//! // An upstream that echoes one message.
//! let upstream = TcpListener::bind("127.0.0.1:0")?;
//! let upstream_addr = upstream.local_addr()?;
//! std::thread::spawn(move || {
//!     let (mut conn, _) = upstream.accept().unwrap();
//!     let mut buf = [0u8; 4];
//!     conn.read_exact(&mut buf).unwrap();
//!     conn.write_all(&buf).unwrap();
//! });
//!
//! // 250 µs each way: a round trip through the proxy costs 0.5 ms more.
//! let proxy = DelayProxy::start(upstream_addr, Duration::from_micros(250))?;
//! let mut conn = TcpStream::connect(proxy.addr())?;
//! let start = Instant::now();
//! conn.write_all(b"ping")?;
//! let mut buf = [0u8; 4];
//! conn.read_exact(&mut buf)?;
//! assert_eq!(&buf, b"ping");
//! assert!(start.elapsed() >= Duration::from_micros(500));
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

/// The largest chunk one read takes.
const CHUNK: usize = 64 * 1024;

/// A running proxy; dropping it stops accepting and shuts down the
/// connections it forwards.
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    delay: Duration,
    own: Duration,
    stop: Arc<AtomicBool>,
    /// Both sockets of every forwarded connection still open, to shut them
    /// down on drop.
    open: Arc<Mutex<Vec<Weak<TcpStream>>>>,
}

impl DelayProxy {
    /// Listens on `127.0.0.1:0` and forwards each connection to `upstream`,
    /// delaying every chunk by `delay` in each direction.
    pub fn start(upstream: SocketAddr, delay: Duration) -> io::Result<Self> {
        Self::start_compensated(upstream, delay, Duration::ZERO)
    }

    /// Like [`start`](Self::start), with `own`, the proxy's own one-way
    /// latency (see [`own_latency`]), taken off the delay: a chunk read at
    /// `t` is written at `t + delay - own`, so that it reaches the other
    /// side about `delay` after it would have without the proxy.
    pub fn start_compensated(
        upstream: SocketAddr,
        delay: Duration,
        own: Duration,
    ) -> io::Result<Self> {
        let wait = delay.saturating_sub(own);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (stop_, open_) = (stop.clone(), open.clone());
        thread::Builder::new()
            .name("delay-proxy-accept".into())
            .spawn(move || accept(listener, upstream, wait, &stop_, &open_))?;
        Ok(DelayProxy {
            addr,
            delay,
            own,
            stop,
            open,
        })
    }

    /// The address to connect to instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The delay added in each direction.
    pub fn delay(&self) -> Duration {
        self.delay
    }

    /// The own latency taken off the delay (zero unless started with
    /// [`start_compensated`](Self::start_compensated)).
    pub fn own(&self) -> Duration {
        self.own
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accepting thread, which then sees `stop`.
        let _ = TcpStream::connect(self.addr);
        if let Ok(open) = self.open.lock() {
            for s in open.iter().filter_map(Weak::upgrade) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    delay: Duration,
    stop: &AtomicBool,
    open: &Mutex<Vec<Weak<TcpStream>>>,
) {
    for client in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        if let Err(e) = forward(client, upstream, delay, open) {
            eprintln!("delay proxy: connection to {upstream}: {e}");
        }
    }
}

/// Starts the four threads of one connection.
fn forward(
    client: TcpStream,
    upstream: SocketAddr,
    delay: Duration,
    open: &Mutex<Vec<Weak<TcpStream>>>,
) -> io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    let (client, server) = (Arc::new(client), Arc::new(server));
    if let Ok(mut open) = open.lock() {
        // The threads hold the sockets; a closed connection's are gone.
        open.retain(|s| s.strong_count() > 0);
        open.push(Arc::downgrade(&client));
        open.push(Arc::downgrade(&server));
    }
    direction(client.clone(), server.clone(), delay, "up")?;
    direction(server, client, delay, "down")?;
    Ok(())
}

/// What a reader hands its writer.
enum Chunk {
    /// Bytes to write at the deadline.
    Data(Instant, Vec<u8>),
    /// The source closed (or failed) at this deadline: close the sink's
    /// writing half then.
    End(Instant),
}

/// One direction, `from` -> `to`: a reader thread and a writer thread.
fn direction(
    from: Arc<TcpStream>,
    to: Arc<TcpStream>,
    delay: Duration,
    name: &str,
) -> io::Result<()> {
    let (tx, rx) = mpsc::channel::<Chunk>();
    let from_ = from.clone();
    thread::Builder::new()
        .name(format!("delay-proxy-{name}-read"))
        .spawn(move || read_chunks(from_, delay, &tx))?;
    thread::Builder::new()
        .name(format!("delay-proxy-{name}-write"))
        .spawn(move || write_chunks(&rx, to, from))?;
    Ok(())
}

fn read_chunks(from: Arc<TcpStream>, delay: Duration, tx: &mpsc::Sender<Chunk>) {
    let mut buf = vec![0u8; CHUNK];
    loop {
        match (&*from).read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = tx.send(Chunk::End(Instant::now() + delay));
                return;
            }
            Ok(n) => {
                let deadline = Instant::now() + delay;
                if tx.send(Chunk::Data(deadline, buf[..n].to_vec())).is_err() {
                    return;
                }
            }
        }
    }
}

fn write_chunks(rx: &mpsc::Receiver<Chunk>, to: Arc<TcpStream>, from: Arc<TcpStream>) {
    let _ = precise_timers();
    while let Ok(chunk) = rx.recv() {
        match chunk {
            Chunk::Data(deadline, bytes) => {
                wait_until(deadline);
                if (&*to).write_all(&bytes).is_err() {
                    // The sink is gone: unblock the reader and the other
                    // direction too.
                    let _ = from.shutdown(Shutdown::Both);
                    let _ = to.shutdown(Shutdown::Both);
                    return;
                }
            }
            Chunk::End(deadline) => {
                wait_until(deadline);
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
        }
    }
}

/// Sleeps until `deadline` (at once when it has passed).
pub fn wait_until(deadline: Instant) {
    let left = deadline.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        thread::sleep(left);
    }
}

/// Sets the calling thread's timer slack to 1 ns, so that a sleep wakes
/// within microseconds of its end instead of up to 50 µs after it (Linux's
/// default slack). Linux keeps a thread's slack in `/proc/<tid>/timerslack_ns`,
/// which a thread may write for itself. Best effort: returns whether it took
/// effect, `false` where the file does not exist.
pub fn precise_timers() -> bool {
    let Ok(link) = std::fs::read_link("/proc/thread-self") else {
        return false;
    };
    let Some(tid) = link.file_name().and_then(|t| t.to_str()) else {
        return false;
    };
    let file = format!("/proc/{tid}/timerslack_ns");
    std::fs::write(&file, "1").is_ok()
        && std::fs::read_to_string(&file).is_ok_and(|s| s.trim() == "1")
}

/// What a proxy adds to a round trip, measured by [`added_round_trip`].
#[derive(Debug, Clone, Copy)]
pub struct AddedLatency {
    /// Median round trip over a direct connection.
    pub direct: Duration,
    /// Median round trip through the proxy.
    pub proxied: Duration,
    /// The delay the proxy adds each way.
    pub delay: Duration,
    /// The proxy's own latency it compensated each way.
    pub own: Duration,
    /// How many ping-pongs each median is taken over.
    pub pings: usize,
}

impl AddedLatency {
    /// `proxied - direct`, ideally twice the delay.
    pub fn added(&self) -> Duration {
        self.proxied.saturating_sub(self.direct)
    }

    /// How far [`added`](Self::added) is from twice the delay, in
    /// microseconds (positive: the proxy adds more than asked).
    pub fn error_us(&self) -> f64 {
        self.added().as_secs_f64() * 1e6 - 2.0 * self.delay.as_secs_f64() * 1e6
    }
}

impl std::fmt::Display for AddedLatency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ping-pongs of 8 bytes, {} us each way ({:.1} us of its own compensated): \
             direct {:.1} us, proxied {:.1} us, added {:.1} us per round trip \
             (asked {}, error {:+.1} us)",
            self.pings,
            self.delay.as_micros(),
            self.own.as_secs_f64() * 1e6,
            self.direct.as_secs_f64() * 1e6,
            self.proxied.as_secs_f64() * 1e6,
            self.added().as_secs_f64() * 1e6,
            2 * self.delay.as_micros(),
            self.error_us()
        )
    }
}

/// The proxy's own one-way latency: half of what a proxy adds to a round
/// trip beyond twice its delay, the median of `pings` ping-pongs (see
/// [`added_round_trip`]). It is measured with a delay of 100 µs, not zero:
/// with a delay the writer thread already waits for the deadline when its
/// chunk is due, as it does in use, rather than being woken for it.
pub fn own_latency(pings: usize) -> io::Result<Duration> {
    let delay = Duration::from_micros(100);
    let m = added_round_trip(delay, Duration::ZERO, pings)?;
    Ok(m.added().saturating_sub(2 * delay) / 2)
}

/// Measures what a [`DelayProxy`] with `delay`, compensating `own` (see
/// [`DelayProxy::start_compensated`]), adds to a round trip: `pings`
/// ping-pongs of 8 bytes against a local echo server, directly and through
/// the proxy, alternating so that drift does not favour either, medians.
pub fn added_round_trip(delay: Duration, own: Duration, pings: usize) -> io::Result<AddedLatency> {
    let pings = pings.max(1);
    let echo = TcpListener::bind("127.0.0.1:0")?;
    let echo_addr = echo.local_addr()?;
    thread::Builder::new()
        .name("delay-proxy-echo".into())
        .spawn(move || {
            for conn in echo.incoming().take(2) {
                let Ok(mut conn) = conn else { continue };
                let _ = conn.set_nodelay(true);
                thread::spawn(move || {
                    let mut buf = [0u8; 8];
                    while conn.read_exact(&mut buf).is_ok() {
                        if conn.write_all(&buf).is_err() {
                            return;
                        }
                    }
                });
            }
        })?;
    let proxy = DelayProxy::start_compensated(echo_addr, delay, own)?;
    let mut direct = TcpStream::connect(echo_addr)?;
    let mut proxied = TcpStream::connect(proxy.addr())?;
    direct.set_nodelay(true)?;
    proxied.set_nodelay(true)?;
    let ping = |conn: &mut TcpStream| -> io::Result<Duration> {
        let mut buf = *b"ping-pon";
        let start = Instant::now();
        conn.write_all(&buf)?;
        conn.read_exact(&mut buf)?;
        Ok(start.elapsed())
    };
    // Warm-up: the proxy's threads, the sockets' buffers.
    for _ in 0..20 {
        ping(&mut direct)?;
        ping(&mut proxied)?;
    }
    let (mut d, mut p) = (Vec::with_capacity(pings), Vec::with_capacity(pings));
    for _ in 0..pings {
        d.push(ping(&mut direct)?);
        p.push(ping(&mut proxied)?);
    }
    d.sort();
    p.sort();
    Ok(AddedLatency {
        direct: d[pings / 2],
        proxied: p[pings / 2],
        delay,
        own,
        pings,
    })
}
