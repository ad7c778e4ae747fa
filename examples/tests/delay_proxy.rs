//! The delaying proxy of the benchmarks: what it adds to a round trip, that
//! it keeps pipelined traffic pipelined, and that it passes a close on.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use idem_examples::delay_proxy::{DelayProxy, added_round_trip, own_latency};

/// An echo server for `conns` connections.
fn echo(conns: usize) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    thread::spawn(move || {
        for conn in listener.incoming().take(conns) {
            let mut conn = conn.unwrap();
            conn.set_nodelay(true).unwrap();
            thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => conn.write_all(&buf[..n]).unwrap(),
                    }
                }
            });
        }
    });
    addr
}

#[test]
fn a_round_trip_costs_twice_the_delay_more() {
    let delay = Duration::from_micros(250);
    let raw = added_round_trip(delay, Duration::ZERO, 1000).unwrap();
    println!("{raw}");
    // Uncompensated, the proxy adds its own hops on top of the delay.
    assert!(raw.added() >= 2 * delay, "{raw}");
    let own = own_latency(1000).unwrap();
    let m = added_round_trip(delay, own, 1000).unwrap();
    println!("{m}");
    // Medians are robust to a loaded machine's outliers; the bounds leave
    // room for a shared runner.
    assert!(m.error_us().abs() < 100.0, "{m}");
}

#[test]
fn pipelined_chunks_are_not_serialised() {
    let proxy = DelayProxy::start(echo(1), Duration::from_micros(500)).unwrap();
    let conn = TcpStream::connect(proxy.addr()).unwrap();
    conn.set_nodelay(true).unwrap();
    let mut reader = conn.try_clone().unwrap();
    let start = Instant::now();
    // 40 messages 100 µs apart: 4 ms of sending. Serialised, each would wait
    // for the one before: at least 40 round trips of 1 ms.
    let sender = thread::spawn(move || {
        let mut conn = conn;
        for i in 0..40u8 {
            conn.write_all(&[i; 8]).unwrap();
            let next = start + Duration::from_micros(100 * (u64::from(i) + 1));
            while Instant::now() < next {
                std::hint::spin_loop();
            }
        }
    });
    let mut got = vec![0u8; 40 * 8];
    reader.read_exact(&mut got).unwrap();
    let elapsed = start.elapsed();
    sender.join().unwrap();
    assert!(got.chunks(8).enumerate().all(|(i, c)| c == [i as u8; 8]));
    println!("40 pipelined messages through 500 us each way: {elapsed:?}");
    // The last message leaves at 3.9 ms and is delayed 0.5 ms each way, at
    // least (a sleep never ends early).
    assert!(
        elapsed >= Duration::from_micros(3_900 + 1_000),
        "{elapsed:?}"
    );
    assert!(elapsed < Duration::from_millis(20), "{elapsed:?}");
}

#[test]
fn a_close_reaches_the_other_side() {
    let upstream = TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy =
        DelayProxy::start(upstream.local_addr().unwrap(), Duration::from_micros(125)).unwrap();
    let mut client = TcpStream::connect(proxy.addr()).unwrap();
    let (mut server, _) = upstream.accept().unwrap();
    client.write_all(b"bye").unwrap();
    client.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    server.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
    server.write_all(b"ok").unwrap();
    drop(server);
    let mut got = Vec::new();
    client.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"ok");
}
