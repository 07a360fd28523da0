//! Replicas behind vLLM's router: `scripts/replicas.sh` starts three
//! `wllm serve` replicas and `vllm-router` (installed from PyPI by the script)
//! in front, and traffic goes through the router with `power_of_two` and with
//! `cache_aware`. Every request is answered, the load spreads over the
//! replicas, requests sharing a long prefix land on the replica that caches it
//! (its prefix-cache hits), and a replica killed mid-run loses only the
//! requests it had in flight while the router routes around it.
//!
//! Where the router cannot be installed (no PyPI, no `python3 -m venv`) the
//! tests skip with the reason printed — except under `CI=true`, where they
//! fail.

mod common;

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::tiny::{TinySpec, write_tiny_gguf};
use common::*;
use serde_json::{Value, json};

const N: usize = 3;

/// The script, its replicas' addresses and pids, and the router's address.
struct Replicas {
    script: Child,
    replicas: Vec<(String, i32)>,
    router: String,
}

impl Drop for Replicas {
    fn drop(&mut self) {
        // The script runs in its own process group: its trap stops the
        // replicas and the router; SIGKILL to the group makes sure.
        let pg = self.script.id() as i32;
        // SAFETY: kill signals the process group this test started; no memory is involved.
        unsafe { libc::kill(-pg, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.script.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // SAFETY: as above.
        unsafe { libc::kill(-pg, libc::SIGKILL) };
        let _ = self.script.wait();
    }
}

/// The router binary, or None (after printing why) where it cannot be installed.
fn router_or_skip(test: &str) -> Option<()> {
    let out = Command::new("scripts/replicas.sh")
        .arg("--install-router")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run scripts/replicas.sh");
    if out.status.success() {
        return Some(());
    }
    let why = String::from_utf8_lossy(&out.stderr).trim().to_string();
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test}: vllm-router could not be installed in CI: {why}");
    }
    eprintln!("{test}: SKIPPED: vllm-router could not be installed: {why}");
    None
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn start(name: &str, policy: &str) -> Replicas {
    let dir = test_dir(name);
    let model = write_tiny_gguf(&dir, "tiny.gguf", &TinySpec::default(), &mut rng(3));
    // Router on `port`, replicas on port+1..=port+N, the router's own metrics on port+N+1.
    let port = loop {
        let p = free_port();
        if p < 60000 && (1..=N as u16 + 1).all(|i| std::net::TcpListener::bind(("127.0.0.1", p + i)).is_ok()) {
            break p;
        }
    };
    let mut script = Command::new("scripts/replicas.sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            &N.to_string(),
            "--port",
            &port.to_string(),
            "--policy",
            policy,
            "--model",
        ])
        .arg(&model)
        .args(["--", "--kv-cache-memory", "8388608", "--max-model-len", "1024"])
        .env("WLLM_BIN", env!("CARGO_BIN_EXE_wllm"))
        .env("RUN_DIR", dir.join("run"))
        .process_group(0)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start scripts/replicas.sh");
    let out = BufReader::new(script.stdout.take().unwrap());
    let mut r = Replicas {
        script,
        replicas: Vec::new(),
        router: String::new(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = rx.recv_timeout(Duration::from_secs(300)).unwrap_or_else(|_| {
            panic!(
                "replicas.sh stopped or was not ready in 300 s (logs in {})",
                dir.display()
            )
        });
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.first() {
            Some(&"replica") => r.replicas.push((w[2].to_string(), w[4].parse().unwrap())),
            Some(&"router") => r.router = w[1].to_string(),
            Some(&"ready") => break,
            _ => {}
        }
    }
    assert_eq!(r.replicas.len(), N);
    r
}

/// A GET, blocking: (status, body).
fn get(url: &str) -> (u16, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(120), wllm::client::get(url)).await })
        .unwrap_or_else(|_| panic!("GET {url} took over 120 s"))
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
}

/// A POST of JSON, blocking: the status and body, or 0 where the connection failed.
fn post(url: &str, body: &Value) -> (u16, Value) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(120), wllm::client::post_json(url, body)).await })
        .unwrap_or_else(|_| panic!("POST {url} took over 120 s"))
        .unwrap_or((0, Value::Null))
}

/// The sum of a counter's series on one replica's /metrics, under vLLM's name.
fn counter(url: &str, name: &str) -> f64 {
    let (_, text) = get(&format!("{url}/metrics"));
    text.lines()
        .filter(|l| l.starts_with(&format!("vllm:{name}{{")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn finished(r: &Replicas) -> Vec<f64> {
    r.replicas
        .iter()
        .map(|(u, _)| counter(u, "request_success_total"))
        .collect()
}

/// One request through the router; its HTTP status.
fn send(router: &str, i: usize, max_tokens: usize) -> u16 {
    let words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"];
    let text: Vec<&str> = (0..(3 + i * 7 % 40)).map(|j| words[(i * 5 + j * 3) % 8]).collect();
    let (path, body) = if i.is_multiple_of(2) {
        (
            "/v1/completions",
            json!({"model": "tiny", "prompt": text.join(" "), "max_tokens": max_tokens, "ignore_eos": true}),
        )
    } else {
        (
            "/v1/chat/completions",
            json!({"model": "tiny", "messages": [{"role": "user", "content": text.join(" ")}],
                   "max_tokens": max_tokens, "ignore_eos": true}),
        )
    };
    let (st, v) = post(&format!("{router}{path}"), &body);
    if st == 200 {
        assert_eq!(v["usage"]["completion_tokens"], max_tokens, "{v}");
    }
    st
}

/// Many requests at once; their statuses.
fn burst(router: &str, from: usize, count: usize, max_tokens: usize) -> Vec<u16> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (from..from + count)
            .map(|i| s.spawn(move || send(router, i, max_tokens)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Mixed traffic (completions and chat, prompts of 3 to 42 words, eight at
/// a time) is answered in full and spread over every replica.
fn mixed_traffic_is_answered_and_spread(r: &Replicas) {
    let before = finished(r);
    let mut st = Vec::new();
    for round in 0..4 {
        st.extend(burst(&r.router, round * 8, 8, 8 + round * 4));
    }
    assert!(st.iter().all(|&s| s == 200), "statuses through the router: {st:?}");
    let per: Vec<f64> = finished(r).iter().zip(&before).map(|(a, b)| a - b).collect();
    eprintln!("requests per replica: {per:?}");
    assert_eq!(per.iter().sum::<f64>(), 32.0, "{per:?}");
    assert!(per.iter().all(|&n| n >= 2.0), "a replica got almost nothing: {per:?}");
}

/// A replica killed with requests in flight: only those may fail; the
/// router then routes around it and every later request is answered.
fn a_killed_replica_loses_only_its_requests(r: &Replicas) {
    let (victim_url, victim) = r.replicas[1].clone();
    let statuses = std::thread::scope(|s| {
        let h = s.spawn(|| burst(&r.router, 100, 9, 700));
        // Wait until the victim has requests running, count them, kill it.
        let t = Instant::now();
        let mut in_flight = 0.0;
        while t.elapsed() < Duration::from_secs(60) {
            in_flight = counter(&victim_url, "num_requests_running") + counter(&victim_url, "num_requests_waiting");
            if in_flight > 0.0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(in_flight > 0.0, "the victim never had a request in flight");
        // SAFETY: kill signals a replica this test's script started; no memory is involved.
        assert_eq!(unsafe { libc::kill(victim, libc::SIGKILL) }, 0);
        (h.join().unwrap(), in_flight)
    });
    let (st, in_flight) = statuses;
    let failed = st.iter().filter(|&&s| s != 200).count();
    eprintln!("killed a replica with {in_flight} requests in flight: statuses {st:?}");
    assert!(
        failed as f64 <= in_flight,
        "{failed} requests failed; the killed replica had {in_flight} in flight"
    );
    let alive: Vec<&String> = r
        .replicas
        .iter()
        .map(|(u, _)| u)
        .filter(|u| **u != victim_url)
        .collect();
    let before: Vec<f64> = alive.iter().map(|u| counter(u, "request_success_total")).collect();
    let after_kill = burst(&r.router, 200, 12, 6);
    assert!(
        after_kill.iter().all(|&s| s == 200),
        "after the kill the router still failed requests: {after_kill:?}"
    );
    let served: f64 = alive
        .iter()
        .zip(&before)
        .map(|(u, b)| counter(u, "request_success_total") - b)
        .sum();
    assert_eq!(served, 12.0, "the live replicas served {served} of 12");
}

#[test]
fn power_of_two_spreads_the_load_and_survives_a_killed_replica() {
    let name = "router_power_of_two";
    if router_or_skip(name).is_none() {
        return;
    }
    let r = start(name, "power_of_two");
    mixed_traffic_is_answered_and_spread(&r);
    a_killed_replica_loses_only_its_requests(&r);
}

/// With `cache_aware`, each group of requests that share a long prefix lands
/// on one replica, which serves the prefix from its cache.
#[test]
fn cache_aware_keeps_a_shared_prefix_on_the_replica_that_caches_it() {
    let name = "router_cache_aware";
    if router_or_skip(name).is_none() {
        return;
    }
    let r = start(name, "cache_aware");
    mixed_traffic_is_answered_and_spread(&r);
    let words = [
        "river", "stone", "cloud", "ember", "maple", "orbit", "quill", "tundra", "violet", "walnut",
    ];
    let mut homes = Vec::new();
    for g in 0..4 {
        let prefix: Vec<&str> = (0..120).map(|j| words[(g * 7 + j * (g + 3)) % 10]).collect();
        let prefix = format!("Document {g}: {}.", prefix.join(" "));
        let (ok0, hit0) = (finished(&r), hits(&r));
        for q in 0..5 {
            let body = json!({"model": "tiny", "prompt": format!("{prefix} Question {q}: why?"), "max_tokens": 4});
            let (st, v) = post(&format!("{}/v1/completions", r.router), &body);
            assert_eq!(st, 200, "{v}");
        }
        let got: Vec<f64> = finished(&r).iter().zip(&ok0).map(|(a, b)| a - b).collect();
        let hit: Vec<f64> = hits(&r).iter().zip(&hit0).map(|(a, b)| a - b).collect();
        eprintln!("prefix group {g}: requests per replica {got:?}, prefix-cache hit tokens {hit:?}");
        let home = got
            .iter()
            .position(|&n| n == 5.0)
            .unwrap_or_else(|| panic!("the 5 requests sharing prefix {g} were split over replicas: {got:?}"));
        assert!(
            hit[home] >= 4.0 * 64.0,
            "replica {home} did not reuse the prefix: {hit:?}"
        );
        homes.push(home);
    }
    // Which replica a new prefix goes to is the router's choice (the one
    // whose cache tree is smallest); only locality is asserted.
    eprintln!("the four prefixes' replicas: {homes:?}");
    a_killed_replica_loses_only_its_requests(&r);
}

fn hits(r: &Replicas) -> Vec<f64> {
    r.replicas
        .iter()
        .map(|(u, _)| counter(u, "prefix_cache_hits_total"))
        .collect()
}
