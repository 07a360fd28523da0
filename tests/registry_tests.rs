//! Several models on one device (`engine::ModelRegistry`): two models loaded
//! at once answer interleaved requests, each as that model alone does;
//! unloading gives the device its memory back (wgpu-hal's counters of live
//! buffer and texture bytes); idle models unload after their keep-alive and
//! the next request reloads them; a load past the budget unloads an idle
//! model or, with every loaded model busy, is refused naming them and the
//! bytes missing; a model unloaded with a request in flight lets it finish.

mod common;

use std::time::Duration;

use common::*;
use wllm::engine::ModelRegistry;
use wllm::{EngineConfig, Prompt, SamplingParams};

fn base() -> EngineConfig {
    EngineConfig {
        kv_cache_memory: Some(64 << 20),
        max_model_len: Some(512),
        max_num_seqs: 8,
        ..Default::default()
    }
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams {
        max_tokens: Some(n),
        ignore_eos: true,
        ..SamplingParams::greedy()
    }
}

fn prompts() -> Vec<String> {
    [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time",
        "The three primary colours are",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn two_models_answer_interleaved_requests_as_each_does_alone() {
    let ctx = &kernels().ctx;
    let reg = ModelRegistry::new(ctx, base(), None, None);
    reg.add("smollm2", default_model_path()).unwrap();
    reg.add("gemma3", gemma3_path()).unwrap();
    assert!(reg.add("gemma3", default_model_path()).is_err(), "names are unique");
    // Each model alone.
    let mut alone = Vec::new();
    for name in ["smollm2", "gemma3"] {
        let e = reg.get(name).unwrap();
        alone.push(
            prompts()
                .into_iter()
                .map(|p| {
                    e.generate(Prompt::Text(p), greedy(12))
                        .unwrap()
                        .collect_all()
                        .unwrap()
                        .token_ids
                })
                .collect::<Vec<_>>(),
        );
        drop(e);
        reg.unload(name).unwrap();
    }
    // Both loaded, requests interleaved from threads.
    let a = reg.get("smollm2").unwrap();
    let b = reg.get("gemma3").unwrap();
    assert!(reg.list().iter().all(|m| m.loaded));
    let got: Vec<(usize, usize, Vec<u32>)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|i| {
                let (m, e) = if i % 2 == 0 { (0, &a) } else { (1, &b) };
                let p = prompts()[i / 2].clone();
                s.spawn(move || {
                    (
                        m,
                        i / 2,
                        e.generate(Prompt::Text(p), greedy(12))
                            .unwrap()
                            .collect_all()
                            .unwrap()
                            .token_ids,
                    )
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (m, p, toks) in got {
        assert_eq!(toks, alone[m][p], "model {m} prompt {p}");
    }
}

#[test]
fn unload_returns_memory_idle_models_unload_and_the_budget_holds() {
    // A device of its own: the counters are the device's, and other tests load models on the shared one.
    let own = wllm::gpu::GpuContext::new(&wllm::gpu::GpuOptions::default()).unwrap();
    let ctx = &own;
    let probe = ModelRegistry::new(ctx, base(), None, None);
    let before = probe.device_bytes();
    probe.add("smollm2", default_model_path()).unwrap();
    let e = probe.load("smollm2").unwrap();
    let loaded = probe.device_bytes();
    let planned = probe.list()[0].bytes;
    let c = ctx.device.get_internal_counters();
    eprintln!(
        "buffers {} textures {}",
        c.hal.buffer_memory.read(),
        c.hal.texture_memory.read()
    );
    eprintln!("device bytes: before {before}, loaded {loaded} (plan {planned})");
    // The memory plan counts what the device holds (within 5 %).
    let took = (loaded - before) as f64;
    assert!(
        took > planned as f64 * 0.95 && took < planned as f64 * 1.05,
        "the device holds {took} bytes for a plan of {planned}"
    );
    // Unloaded with a request in flight: it finishes, then the memory goes.
    let stream = e.generate(Prompt::Text("Once upon a time".into()), greedy(20)).unwrap();
    drop(e);
    assert!(probe.unload("smollm2").unwrap());
    assert!(!probe.list()[0].loaded);
    let done = stream.collect_all().unwrap();
    assert_eq!(done.token_ids.len(), 20, "the request in flight finished");
    let after = probe.device_bytes();
    eprintln!("device bytes after unload: {after}");
    assert!(
        after <= before,
        "unloading gives every byte back: {after} after, {before} before"
    );
    drop(probe);

    // Idle unload: a model with a keep-alive of 0.3 s, used then left.
    let reg = ModelRegistry::new(ctx, base(), None, Some(Duration::from_secs(3600)));
    reg.add("smollm2", default_model_path()).unwrap();
    reg.add("gemma3", gemma3_path()).unwrap();
    reg.set_keep_alive("smollm2", Some(Duration::from_millis(300))).unwrap();
    let e = reg.get("smollm2").unwrap();
    e.generate(Prompt::Text("Hi".into()), greedy(2))
        .unwrap()
        .collect_all()
        .unwrap();
    assert!(reg.unload_idle().is_empty(), "held: not idle");
    drop(e);
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(reg.unload_idle(), vec!["smollm2".to_string()]);
    let e = reg.get("smollm2").unwrap();
    let info = reg.list().into_iter().find(|m| m.name == "smollm2").unwrap();
    assert!(info.loaded && info.loads == 2, "{info:?}");
    eprintln!("reload took {:.2} s", info.load_seconds.unwrap());
    drop(e);
    reg.unload("smollm2").unwrap();
    drop(reg);

    // A budget that holds one model at a time.
    let sizes: Vec<u64> = ["smollm2", "gemma3"]
        .iter()
        .map(|n| {
            let r = ModelRegistry::new(ctx, base(), None, None);
            r.add(
                n,
                if *n == "smollm2" {
                    default_model_path()
                } else {
                    gemma3_path()
                },
            )
            .unwrap();
            let _e = r.load(n).unwrap();
            r.list()[0].bytes
        })
        .collect();
    let budget = sizes[0].max(sizes[1]) + sizes[0].min(sizes[1]) / 2;
    let reg = ModelRegistry::new(ctx, base(), Some(budget), None);
    reg.add("smollm2", default_model_path()).unwrap();
    reg.add("gemma3", gemma3_path()).unwrap();
    let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = told.clone();
    reg.set_observer(std::sync::Arc::new(move |e: &wllm::engine::ModelEvent| {
        t.lock().unwrap().push(e.describe())
    }));
    let busy = reg.get("smollm2").unwrap();
    let e = reg.get("gemma3").err().expect("refused: smollm2 is busy").to_string();
    eprintln!("{e}");
    assert!(e.contains("smollm2") && e.contains("missing"), "{e}");
    drop(busy);
    let g = reg.get("gemma3").unwrap();
    let l = reg.list();
    assert!(!l[1].loaded && l[0].loaded, "the idle model made room: {l:?}");
    let told = told.lock().unwrap().clone();
    assert!(told.iter().any(|t| t == "unloaded model smollm2 (evicted)"), "{told:?}");
    g.generate(Prompt::Text("Hi".into()), greedy(2))
        .unwrap()
        .collect_all()
        .unwrap();
}

#[test]
fn a_load_runs_outside_the_lock_warmed_up_and_told_to_the_observer_and_the_trace() {
    use std::sync::{Arc, mpsc};
    use wllm::engine::{ModelEvent, ModelEventKind};
    let ctx = &kernels().ctx;
    let mut reg = ModelRegistry::new(ctx, base(), None, None);
    reg.warm_up = true;
    let reg = Arc::new(reg);
    reg.add("chat", default_model_path()).unwrap();
    // The primary engine of a server, recording a trace.
    let primary = wllm::Engine::new(&EngineConfig {
        model: default_model_path(),
        trace_steps: 64,
        ..base()
    })
    .unwrap();
    let (tx, rx) = mpsc::channel::<(ModelEvent, Option<Vec<wllm::engine::ModelInfo>>)>();
    let weak = Arc::downgrade(&reg);
    let p = primary.clone();
    let tx = std::sync::Mutex::new(tx);
    reg.set_observer(Arc::new(move |e: &ModelEvent| {
        p.trace_model_event(e);
        // While the load runs, another thread lists the models: it is answered
        // (the registry is not locked) and sees the model loading.
        let listed = (e.kind == ModelEventKind::Loading).then(|| {
            let r = weak.upgrade().expect("the registry lives");
            let (ltx, lrx) = mpsc::channel();
            std::thread::spawn(move || ltx.send(r.list()));
            lrx.recv_timeout(Duration::from_secs(60))
                .expect("list() answered while a load ran")
        });
        let _ = tx.lock().unwrap().send((e.clone(), listed));
    }));
    // Two callers at once: one load, both get the model.
    let engines: Vec<wllm::Engine> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2).map(|_| s.spawn(|| reg.get("chat").unwrap())).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let info = reg.list().remove(0);
    assert!(info.loaded && !info.loading && info.loads == 1, "{info:?}");
    let (loading, listed) = rx.recv().unwrap();
    assert_eq!(loading.kind, ModelEventKind::Loading);
    let listed = listed.unwrap();
    assert!(
        listed[0].loading && !listed[0].loaded && listed[0].bytes > 0,
        "seen during the load: {listed:?}"
    );
    let (loaded, _) = rx.recv().unwrap();
    let ModelEventKind::Loaded {
        seconds,
        warm_up_seconds,
        bytes,
    } = loaded.kind
    else {
        panic!("{loaded:?}")
    };
    eprintln!("{}", loaded.describe());
    assert!(warm_up_seconds > 0.0 && warm_up_seconds < seconds, "{loaded:?}");
    assert_eq!(bytes, info.bytes);
    assert_eq!(Some(seconds), info.load_seconds);
    assert!(rx.try_recv().is_err(), "one load told");
    drop(engines);
    assert!(reg.unload("chat").unwrap());
    let (unloaded, _) = rx.recv().unwrap();
    assert_eq!(unloaded.kind, ModelEventKind::Unloaded { reason: "request" });
    // The primary engine's trace: the load as a span, the unload as an instant,
    // in a process of their own.
    let trace = primary.trace().unwrap();
    wllm::trace::tef::validate(&trace).unwrap();
    let ev = trace["traceEvents"].as_array().unwrap();
    let find = |name: &str| ev.iter().find(|e| e["name"] == name && e["pid"] == 2);
    let load = find("load chat").expect("the load is in the trace");
    assert_eq!(load["ph"], "X");
    assert!((load["dur"].as_f64().unwrap() / 1e6 - seconds).abs() < 0.01, "{load}");
    assert_eq!(find("unload chat").expect("the unload too")["ph"], "i");
}

/// A tiny model's registry settings, and the bytes one model of `spec` takes.
fn tiny(dir: &std::path::Path, name: &str, spec: &common::tiny::TinySpec) -> (std::path::PathBuf, u64) {
    let path = common::tiny::write_tiny_gguf(dir, name, spec, &mut rng(9));
    let r = ModelRegistry::new(&kernels().ctx, tiny_base(), None, None);
    r.add("m", &path).unwrap();
    let _e = r.load("m").unwrap();
    (path.clone(), r.list()[0].bytes)
}

fn tiny_base() -> EngineConfig {
    EngineConfig {
        kv_cache_memory: Some(1 << 20),
        max_model_len: Some(64),
        ..Default::default()
    }
}

/// Row 5 of issue 57's review: a model unloaded while a request held its
/// engine stopped counting, so reloading it three times took the device to
/// 5x the budget. Its bytes now count until the last clone drops.
#[test]
fn an_unloaded_models_bytes_count_until_its_last_request_ends() {
    let dir = test_dir("reg_draining");
    let (a, size) = tiny(&dir, "a.gguf", &common::tiny::TinySpec::default());
    let reg = ModelRegistry::new(&kernels().ctx, tiny_base(), Some(size + size / 2), None);
    reg.add("a", &a).unwrap();
    for round in 0..3 {
        let request = reg.get("a").unwrap();
        assert!(reg.unload("a").unwrap());
        let info = reg.list().into_iter().next().unwrap();
        assert!(!info.loaded && info.draining_bytes == size, "round {round}: {info:?}");
        let e = reg.get("a").err().expect("the held engine's bytes still count");
        assert!(matches!(e, wllm::EngineError::Busy(_)), "{e}");
        assert!(e.to_string().contains("requests finishing"), "{e}");
        let weak = request.downgrade();
        drop(request);
        assert!(!weak.is_alive(), "the last clone went with the request");
        assert_eq!(reg.list()[0].draining_bytes, 0);
    }
    let e = reg.get("a").unwrap();
    e.generate(Prompt::Tokens(vec![1, 2]), greedy(2))
        .unwrap()
        .collect_all()
        .unwrap();
}

/// Row 6: a model over the budget evicted an idle smaller one first, then
/// failed with a 500 naming nothing. Now nothing is evicted for a load that
/// cannot fit, and the refusal says why (507 at the server: `OverBudget`).
#[test]
fn a_load_that_cannot_fit_evicts_nothing() {
    let dir = test_dir("reg_overbudget");
    let (small, small_size) = tiny(&dir, "small.gguf", &common::tiny::TinySpec::default());
    let big_spec = common::tiny::TinySpec {
        hidden: 256,
        inter: 512,
        layers: 4,
        ..Default::default()
    };
    let (big, big_size) = tiny(&dir, "big.gguf", &big_spec);
    assert!(big_size > small_size * 2, "{big_size} {small_size}");
    let budget = small_size + small_size / 2;
    let reg = ModelRegistry::new(&kernels().ctx, tiny_base(), Some(budget), None);
    reg.add("small", &small).unwrap();
    reg.add("big", &big).unwrap();
    let told = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = told.clone();
    reg.set_observer(std::sync::Arc::new(move |e: &wllm::engine::ModelEvent| {
        t.lock().unwrap().push(e.describe())
    }));
    drop(reg.get("small").unwrap());
    let e = reg.get("big").err().expect("over the whole budget");
    assert!(matches!(e, wllm::EngineError::OverBudget(_)), "{e}");
    assert!(e.to_string().contains("more than the whole"), "{e}");
    assert!(reg.is_loaded("small"), "the idle model was evicted for nothing");
    assert!(
        !told.lock().unwrap().iter().any(|t| t.contains("unloaded")),
        "{:?}",
        told.lock().unwrap()
    );
}

/// Row 11: a `/metrics` scrape held clones of the registry's engines, so a
/// model stayed "busy" (and alive) while the scrape waited. A scrape now
/// reads the metrics each engine thread publishes, through a handle that
/// holds no engine.
#[test]
fn a_metrics_handle_holds_no_engine() {
    let dir = test_dir("reg_metrics_handle");
    let (a, _) = tiny(&dir, "a.gguf", &common::tiny::TinySpec::default());
    let reg = ModelRegistry::new(&kernels().ctx, tiny_base(), None, None);
    reg.add("a", &a).unwrap();
    let e = reg.get("a").unwrap();
    let done = e
        .generate(Prompt::Tokens(vec![1, 2]), greedy(3))
        .unwrap()
        .collect_all()
        .unwrap();
    assert_eq!(done.token_ids.len(), 3);
    let handle = e.metrics_handle();
    let weak = e.downgrade();
    drop(e);
    // Published before the outputs were sent: the finished request is counted.
    let m = handle.snapshot();
    assert_eq!((m.generation_tokens_total, m.request_success_total), (3, 1));
    assert!(reg.unload("a").unwrap());
    assert!(!weak.is_alive(), "the metrics handle kept the engine alive");
    assert_eq!(reg.list()[0].draining_bytes, 0);
    assert_eq!(handle.snapshot().generation_tokens_total, 3);
}
