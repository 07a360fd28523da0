//! ModelRegistry: several models on one device, each its own `Engine` (its
//! weights, KV pool, step buffers and step thread), loaded by name on first
//! use and unloaded on request or after sitting idle (Ollama's
//! `keep_alive`). Loading a model that would take the loaded ones past the
//! memory budget first unloads the least recently used idle models; where
//! that is not enough it is refused, naming what is loaded and how much is
//! missing. A model is idle when no request holds it (no stream of it is
//! alive). Unloading a model with requests in flight lets them finish: the
//! registry drops its handle, and the engine (and its memory) goes when its
//! last stream does. Loads reuse the device's pipelines and the persisted
//! pipeline cache, so a reload compiles nothing. A load runs outside the
//! registry's lock (its bytes reserved first), so listing, routing to other
//! models and unloading go on meanwhile; callers of the model being loaded
//! wait for that one load. Loads and unloads are told to an observer
//! (`set_observer`: the server logs them and puts them in its step trace).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::model_event::{ModelEvent, ModelEventKind, ModelObserver, mib};
use super::{Engine, EngineConfig, EngineError, LlmEngine, MemoryPlan, WeakEngine};
use crate::backend::Backend;
use crate::backend::wgsl::Kernels;
use crate::gpu::GpuContext;
use crate::model::ModelFiles;

/// One model's place in the registry.
struct Slot {
    path: PathBuf,
    engine: Option<Engine>,
    /// A load of it is under way (its bytes reserved).
    loading: bool,
    /// Bytes its plan reserves while loaded or loading.
    bytes: u64,
    last_used: Instant,
    /// How long it may sit idle before it is unloaded (`None`: the registry's).
    keep_alive: Option<Duration>,
    load_seconds: Option<f64>,
    loads: u32,
    /// Engines of it unloaded while something still held a clone (a request
    /// finishing, a scrape): their bytes count until the last clone drops.
    draining: Vec<(WeakEngine, u64)>,
}

impl Slot {
    /// Whether its bytes count against the budget: loaded, or reserved by a load under way.
    fn holds_memory(&self) -> bool {
        self.engine.is_some() || self.loading
    }

    /// Bytes of its unloaded engines still alive (forgetting those that are gone).
    fn draining_bytes(&mut self) -> u64 {
        self.draining.retain(|(e, _)| e.is_alive());
        self.draining.iter().map(|(_, b)| b).sum()
    }

    /// Bytes it holds on the device: loaded or loading, and draining.
    fn device_bytes(&mut self) -> u64 {
        let live = if self.holds_memory() { self.bytes } else { 0 };
        live + self.draining_bytes()
    }

    /// Drops the registry's handle on its engine; whatever else holds the
    /// engine keeps its memory counted until it lets go. Returns whether it was loaded.
    fn unload(&mut self) -> bool {
        match self.engine.take() {
            Some(e) => {
                let weak = e.downgrade();
                drop(e);
                if weak.is_alive() {
                    self.draining.push((weak, self.bytes));
                }
                true
            }
            None => false,
        }
    }
}

/// What `ModelRegistry::list` tells of a model.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ModelInfo {
    pub name: String,
    pub path: PathBuf,
    pub loaded: bool,
    /// A load of it is under way.
    pub loading: bool,
    /// Requests of it in flight (loaded only).
    pub busy: bool,
    /// Device bytes its memory plan reserves (weights, step buffers, KV pool), while loaded.
    pub bytes: u64,
    /// Device bytes of its unloaded engines that requests still hold (they
    /// count against the budget until those requests end).
    pub draining_bytes: u64,
    pub idle_seconds: f64,
    /// Seconds its last load took, and how many times it was loaded.
    pub load_seconds: Option<f64>,
    pub loads: u32,
}

/// Models by name on one device.
pub struct ModelRegistry {
    ctx: GpuContext,
    /// Every engine's settings but the model.
    base: EngineConfig,
    /// Bytes all loaded models' plans may reserve together (`None`: no limit).
    pub budget: Option<u64>,
    /// Idle time after which a model is unloaded (`None`: never).
    pub idle_unload: Option<Duration>,
    /// Warm each model's pipelines up as it loads (`LlmEngine::warm_up`), so
    /// that its first request compiles nothing; its time counts in the load's.
    pub warm_up: bool,
    slots: Mutex<BTreeMap<String, Slot>>,
    /// Signalled when a load ends.
    load_ended: Condvar,
    observer: Mutex<Option<ModelObserver>>,
}

impl ModelRegistry {
    pub fn new(ctx: &GpuContext, base: EngineConfig, budget: Option<u64>, idle_unload: Option<Duration>) -> Self {
        Self {
            ctx: ctx.clone(),
            base,
            budget,
            idle_unload,
            warm_up: false,
            slots: Mutex::new(BTreeMap::new()),
            load_ended: Condvar::new(),
            observer: Mutex::new(None),
        }
    }

    /// Sets the observer told every load and unload (replacing any).
    pub fn set_observer(&self, observer: ModelObserver) {
        *self.observer.lock().unwrap_or_else(|p| p.into_inner()) = Some(observer);
    }

    fn tell(&self, model: &str, kind: ModelEventKind, start: Instant) {
        let o = self.observer.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(o) = o {
            o(&ModelEvent {
                model: model.into(),
                kind,
                start,
                end: Instant::now(),
            });
        }
    }

    fn told_unloaded(&self, names: &[String], reason: &'static str) {
        if names.is_empty() {
            return;
        }
        // The unloaded models' memory goes back now (where no request holds them).
        let _ = self.ctx.device_bytes();
        let now = Instant::now();
        for n in names {
            self.tell(n, ModelEventKind::Unloaded { reason }, now);
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Slot>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a model file (or Hugging Face directory) under `name`, not loaded.
    pub fn add(&self, name: &str, path: impl Into<PathBuf>) -> Result<(), EngineError> {
        let path = path.into();
        if name.is_empty() {
            return Err(EngineError::Config("a model name must not be empty".into()));
        }
        if !path.exists() {
            return Err(EngineError::Config(format!(
                "model {name}: {} does not exist",
                path.display()
            )));
        }
        let mut slots = self.slots();
        if let Some(s) = slots.get(name) {
            return Err(EngineError::Config(format!(
                "the name {name} is taken by {}: give each model its own name",
                s.path.display()
            )));
        }
        slots.insert(
            name.into(),
            Slot {
                path,
                engine: None,
                loading: false,
                bytes: 0,
                last_used: Instant::now(),
                keep_alive: None,
                load_seconds: None,
                loads: 0,
                draining: Vec::new(),
            },
        );
        Ok(())
    }

    /// Registers every `.gguf` file of `dir`, each named after its file stem; returns the names.
    pub fn add_dir(&self, dir: &Path) -> Result<Vec<String>, EngineError> {
        let rd = std::fs::read_dir(dir).map_err(|e| EngineError::Config(format!("{}: {e}", dir.display())))?;
        let mut files: Vec<PathBuf> = rd
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x.eq_ignore_ascii_case("gguf")))
            .collect();
        files.sort();
        let mut names = Vec::new();
        for f in files {
            let name = f
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            self.add(&name, &f)?;
            names.push(name);
        }
        Ok(names)
    }

    /// Whether a model of this name is registered.
    pub fn contains(&self, name: &str) -> bool {
        self.slots().contains_key(name)
    }

    /// Whether the model is loaded now.
    pub fn is_loaded(&self, name: &str) -> bool {
        self.slots().get(name).is_some_and(|s| s.engine.is_some())
    }

    /// The loaded models' engines, by name (each clone holds its model until dropped).
    pub fn loaded(&self) -> Vec<(String, Engine)> {
        self.slots()
            .iter()
            .filter_map(|(n, s)| Some((n.clone(), s.engine.clone()?)))
            .collect()
    }

    /// Every model, loaded or not, by name.
    pub fn list(&self) -> Vec<ModelInfo> {
        let now = Instant::now();
        self.slots()
            .iter_mut()
            .map(|(name, s)| ModelInfo {
                draining_bytes: s.draining_bytes(),
                name: name.clone(),
                path: s.path.clone(),
                loaded: s.engine.is_some(),
                loading: s.loading,
                busy: s.engine.as_ref().is_some_and(|e| !e.is_idle_but(1)),
                bytes: if s.holds_memory() { s.bytes } else { 0 },
                idle_seconds: (now - s.last_used).as_secs_f64(),
                load_seconds: s.load_seconds,
                loads: s.loads,
            })
            .collect()
    }

    /// Sets how long `name` may sit idle before it is unloaded (`None`: the registry's `idle_unload`).
    pub fn set_keep_alive(&self, name: &str, keep_alive: Option<Duration>) -> Result<(), EngineError> {
        let mut slots = self.slots();
        let s = slots.get_mut(name).ok_or_else(|| unknown(name))?;
        s.keep_alive = keep_alive;
        Ok(())
    }

    /// The model's engine, loaded now if it is not (see `load`); marks it used.
    pub fn get(&self, name: &str) -> Result<Engine, EngineError> {
        self.load(name)
    }

    /// Loads `name` if it is not loaded, first unloading least recently used
    /// idle models where the budget needs their room; returns its engine.
    /// Where another caller is loading it, waits for that load.
    pub fn load(&self, name: &str) -> Result<Engine, EngineError> {
        loop {
            let path = match self.loaded_or_path(name)? {
                Ok(engine) => return Ok(engine),
                Err(path) => path,
            };
            let cfg = EngineConfig {
                model: path,
                ..self.base.clone()
            };
            // The plan reads the file's header: outside the lock.
            let need = self.plan(&cfg)?.total();
            let evicted = {
                let mut slots = self.slots();
                let s = slots.get_mut(name).ok_or_else(|| unknown(name))?;
                if s.holds_memory() {
                    // Loaded or begun by another caller meanwhile.
                    continue;
                }
                let evicted = self.make_room(&mut slots, name, need)?;
                let s = slots.get_mut(name).ok_or_else(|| unknown(name))?;
                s.loading = true;
                s.bytes = need;
                evicted
            };
            self.told_unloaded(&evicted, "evicted");
            return self.load_reserved(name, &cfg);
        }
    }

    /// The model's engine where it is loaded (waiting out a load under way),
    /// else its path.
    fn loaded_or_path(&self, name: &str) -> Result<Result<Engine, PathBuf>, EngineError> {
        let mut slots = self.slots();
        loop {
            let s = slots.get_mut(name).ok_or_else(|| unknown(name))?;
            s.last_used = Instant::now();
            if let Some(e) = &s.engine {
                return Ok(Ok(e.clone()));
            }
            if !s.loading {
                return Ok(Err(s.path.clone()));
            }
            slots = self.load_ended.wait(slots).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Unloads least recently used idle models until `need` more bytes fit
    /// the budget; returns their names. Where even unloading every idle
    /// model would not make room, nothing is unloaded and the error gives
    /// the figures: `OverBudget` when the model is larger than the whole
    /// budget, else `Busy` (the models in use, loading or still draining).
    fn make_room(&self, slots: &mut BTreeMap<String, Slot>, name: &str, need: u64) -> Result<Vec<String>, EngineError> {
        let Some(budget) = self.budget else {
            return Ok(Vec::new());
        };
        if need > budget {
            return Err(EngineError::OverBudget(format!(
                "loading {name} needs {}, more than the whole models' budget of {}: raise --models-memory or use \
                 a smaller model (or quantisation)",
                mib(need),
                mib(budget)
            )));
        }
        let held: u64 = slots.values_mut().map(Slot::device_bytes).sum();
        let idle = |s: &Slot| s.engine.as_ref().is_some_and(|e| e.is_idle_but(1));
        let freeable: u64 = slots.values().filter(|s| idle(s)).map(|s| s.bytes).sum();
        if held - freeable + need > budget {
            let holders: Vec<String> = slots
                .iter_mut()
                .filter_map(|(n, s)| {
                    let draining = s.draining_bytes();
                    let state = match (s.loading, s.engine.is_some(), idle(s)) {
                        (true, _, _) => "loading",
                        (_, true, false) => "busy",
                        (_, true, true) => "idle",
                        _ if draining > 0 => "unloaded, requests finishing",
                        _ => return None,
                    };
                    let bytes = if s.holds_memory() { s.bytes } else { 0 } + draining;
                    Some(format!("{n} ({}, {state})", mib(bytes)))
                })
                .collect();
            return Err(EngineError::Busy(format!(
                "loading {name} needs {} but the models' budget of {} holds {} already ({}), {} of it in use: \
                 {} missing; retry once their requests end, unload a model, or raise --models-memory",
                mib(need),
                mib(budget),
                mib(held),
                holders.join(", "),
                mib(held - freeable),
                mib(held - freeable + need - budget)
            )));
        }
        let mut evicted = Vec::new();
        let mut held = held;
        while held + need > budget {
            let victim = slots
                .iter()
                .filter(|(_, s)| idle(s))
                .min_by_key(|(_, s)| s.last_used)
                .map(|(n, _)| n.clone());
            let Some(v) = victim else { break };
            if let Some(s) = slots.get_mut(&v) {
                held -= s.bytes;
                s.unload();
            }
            evicted.push(v);
        }
        Ok(evicted)
    }

    /// Loads a model whose bytes `load` reserved, outside the lock, and
    /// records the result (waking callers waiting for it).
    fn load_reserved(&self, name: &str, cfg: &EngineConfig) -> Result<Engine, EngineError> {
        let t = Instant::now();
        // A panic in the load must not leave the slot loading forever.
        let mut guard = LoadGuard {
            reg: self,
            name,
            armed: true,
        };
        self.tell(name, ModelEventKind::Loading, t);
        let built = (|| {
            let mut core = LlmEngine::with_context(&self.ctx, cfg)?;
            let w = Instant::now();
            if self.warm_up {
                core.warm_up()?;
            }
            let warm = w.elapsed().as_secs_f64();
            Ok::<_, EngineError>((Engine::from_core(core), warm))
        })();
        guard.armed = false;
        let seconds = t.elapsed().as_secs_f64();
        let mut slots = self.slots();
        let slot = slots.get_mut(name).ok_or_else(|| unknown(name))?;
        slot.loading = false;
        let kind = match &built {
            Ok((engine, warm)) => {
                slot.bytes = engine.memory_plan().total();
                slot.load_seconds = Some(seconds);
                slot.loads += 1;
                slot.last_used = Instant::now();
                slot.engine = Some(engine.clone());
                ModelEventKind::Loaded {
                    seconds,
                    warm_up_seconds: *warm,
                    bytes: slot.bytes,
                }
            }
            Err(e) => {
                slot.bytes = 0;
                ModelEventKind::LoadFailed { error: e.to_string() }
            }
        };
        drop(slots);
        self.load_ended.notify_all();
        self.tell(name, kind, t);
        built.map(|(engine, _)| engine)
    }

    /// Unloads `name`: its requests in flight finish, then its memory goes.
    /// Returns whether it was loaded (a model still loading is not: unload
    /// it once its load ends).
    pub fn unload(&self, name: &str) -> Result<bool, EngineError> {
        let was = {
            let mut slots = self.slots();
            let s = slots.get_mut(name).ok_or_else(|| unknown(name))?;
            s.unload()
        };
        if was {
            self.told_unloaded(&[name.to_string()], "request");
        }
        Ok(was)
    }

    /// Unloads every idle model whose idle time passed its keep-alive (a
    /// model seen busy here counts as used now); returns their names.
    pub fn unload_idle(&self) -> Vec<String> {
        let now = Instant::now();
        let mut gone = Vec::new();
        for (name, s) in self.slots().iter_mut() {
            // A model in use is not idle: its idle time counts from the last
            // call that saw it busy (the server calls every second).
            if s.engine.as_ref().is_some_and(|e| !e.is_idle_but(1)) {
                s.last_used = now;
                continue;
            }
            let Some(limit) = s.keep_alive.or(self.idle_unload) else {
                continue;
            };
            if s.engine.is_some() && now - s.last_used >= limit {
                s.unload();
                gone.push(name.clone());
            }
        }
        self.told_unloaded(&gone, "idle");
        gone
    }

    /// The device's bytes in live buffers and textures (`GpuContext::device_bytes`).
    pub fn device_bytes(&self) -> u64 {
        self.ctx.device_bytes()
    }

    /// The memory plan a model would load with, without loading it.
    fn plan(&self, cfg: &EngineConfig) -> Result<MemoryPlan, EngineError> {
        let kernels = Kernels::with_tiles(&self.ctx, cfg.gemm_tiles)?;
        let files = ModelFiles::open_with(&cfg.model, cfg.quantize)?;
        let c = files.config()?;
        let groups = super::KvGroups::of(&c, cfg.hybrid_kv_cache);
        LlmEngine::plan_memory(
            kernels.device_memory(),
            kernels.shares_host_memory(),
            kernels.reads_narrow_weights(),
            &files,
            &c,
            groups.len(),
            cfg,
            None,
        )
    }
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let models: Vec<(String, bool)> = self.list().into_iter().map(|m| (m.name, m.loaded)).collect();
        f.debug_struct("ModelRegistry")
            .field("models", &models)
            .field("budget", &self.budget)
            .field("idle_unload", &self.idle_unload)
            .finish()
    }
}

/// Clears a slot's `loading` mark if its load unwinds.
struct LoadGuard<'a> {
    reg: &'a ModelRegistry,
    name: &'a str,
    armed: bool,
}

impl Drop for LoadGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            if let Some(s) = self.reg.slots().get_mut(self.name) {
                s.loading = false;
                s.bytes = 0;
            }
            self.reg.load_ended.notify_all();
        }
    }
}

fn unknown(name: &str) -> EngineError {
    EngineError::InvalidRequest(format!("no model is named {name}"))
}
