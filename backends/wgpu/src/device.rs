//! Adapter discovery, selection and device creation (platform.md §1), and the device-health
//! record that turns wgpu's asynchronous failures (device lost, uncaptured validation or
//! out-of-memory errors) into [`Error::Device`] at the next op.

use sparkling_core::{Error, Result};
use std::sync::{Arc, Mutex};

/// A wgpu instance honouring `WGPU_BACKEND` (e.g. `vulkan`, `gl`) and the other `WGPU_*`
/// environment variables; no display handle (compute only).
pub(crate) fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// Every adapter of every enabled backend, in the instance's enumeration order (native only:
/// a browser offers one adapter through `navigator.gpu.requestAdapter`).
#[cfg(not(target_arch = "wasm32"))]
pub(crate) fn adapters(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()))
}

/// One line describing an adapter: `name (backend, device type, driver info)`.
pub(crate) fn describe(info: &wgpu::AdapterInfo) -> String {
    let driver = [info.driver.as_str(), info.driver_info.as_str()].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join(" ");
    format!("{} ({:?}, {:?}, {})", info.name, info.backend, info.device_type, if driver.is_empty() { "unknown driver" } else { &driver })
}

/// The message of [`Error::Unavailable`] when no adapter exists at all.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) const NO_ADAPTER: &str = "no wgpu adapter found (no Vulkan, Metal, DX12 or GL driver is visible). \
On Debian/Ubuntu without a GPU, `scripts/install-lavapipe` installs Mesa's CPU Vulkan driver (lavapipe)";

/// Choose an adapter. `want`: `None` = the `WGPU_ADAPTER_NAME` environment variable if set,
/// else wgpu's default high-performance adapter, else the first one enumerated; `Some(s)` =
/// the adapter at index `s` of [`adapters`] when `s` is a number, else the first whose name
/// contains `s` (case-insensitive).
/// Errors: [`Error::Unavailable`] naming the available adapters when nothing matches.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) async fn select(inst: &wgpu::Instance, want: Option<&str>) -> Result<wgpu::Adapter> {
    let list = inst.enumerate_adapters(wgpu::Backends::all()).await;
    if list.is_empty() {
        return Err(Error::Unavailable(NO_ADAPTER.into()));
    }
    let env = std::env::var("WGPU_ADAPTER_NAME").ok().filter(|s| !s.trim().is_empty());
    let want = want.map(str::to_string).or(env);
    let names = || list.iter().enumerate().map(|(i, a)| format!("{i}: {}", describe(&a.get_info()))).collect::<Vec<_>>().join("; ");
    match want {
        Some(w) => {
            let w = w.trim();
            if let Ok(i) = w.parse::<usize>() {
                return list.get(i).cloned().ok_or_else(|| Error::Unavailable(format!("adapter index {i} out of range; available adapters: {}", names())));
            }
            let lw = w.to_lowercase();
            list.iter()
                .find(|a| a.get_info().name.to_lowercase().contains(&lw))
                .cloned()
                .ok_or_else(|| Error::Unavailable(format!("no adapter name contains {w:?}; available adapters: {}", names())))
        }
        None => {
            let opts = wgpu::RequestAdapterOptions {
                power_preference: wgpu::PowerPreference::HighPerformance,
                force_fallback_adapter: false,
                compatible_surface: None,
                ..Default::default()
            };
            match inst.request_adapter(&opts).await {
                Ok(a) => Ok(a),
                Err(_) => Ok(list[0].clone()),
            }
        }
    }
}

/// Run `f` (buffer or pipeline creation) and return the out-of-memory / validation error it
/// raised, if any. Native: error scopes around `f`, popped at once (wgpu answers on the host, no
/// GPU wait). In the browser the answer is a promise that cannot be awaited synchronously, so
/// no scope is pushed: a failure reaches the uncaptured-error handler, [`Health`] records it
/// and the next op returns it as [`Error::Device`].
pub(crate) fn checked<T>(device: &wgpu::Device, f: impl FnOnce() -> T) -> (T, Option<wgpu::Error>) {
    #[cfg(not(target_arch = "wasm32"))]
    {
        let oom = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let val = device.push_error_scope(wgpu::ErrorFilter::Validation);
        let out = f();
        let v = pollster::block_on(val.pop());
        let o = pollster::block_on(oom.pop());
        (out, o.or(v))
    }
    #[cfg(target_arch = "wasm32")]
    {
        let _ = device;
        (f(), None)
    }
}

/// The browser's WebGPU adapter (`navigator.gpu.requestAdapter`, high performance); `want`
/// must be `None` or match its name.
/// Errors: [`Error::Unavailable`] when the browser offers no WebGPU adapter or `want` does not
/// match it.
#[cfg(target_arch = "wasm32")]
pub(crate) async fn select(inst: &wgpu::Instance, want: Option<&str>) -> Result<wgpu::Adapter> {
    let opts = wgpu::RequestAdapterOptions { power_preference: wgpu::PowerPreference::HighPerformance, ..Default::default() };
    let a = inst.request_adapter(&opts).await.map_err(|e| {
        Error::Unavailable(format!(
            "this browser offers no WebGPU adapter ({e}); use a browser with WebGPU enabled (Chrome/Chromium ≥ 113; headless Chromium needs --enable-unsafe-webgpu)"
        ))
    })?;
    if let Some(w) = want.map(str::trim).filter(|w| !w.is_empty() && *w != "0") {
        let name = a.get_info().name;
        if !name.to_lowercase().contains(&w.to_lowercase()) {
            return Err(Error::Unavailable(format!("no adapter name contains {w:?}; the browser offers one adapter: {}", describe(&a.get_info()))));
        }
    }
    Ok(a)
}

/// Asynchronous failures recorded by wgpu callbacks; checked at the start of every op.
#[derive(Default)]
pub(crate) struct Health {
    failure: Mutex<Option<String>>,
}

impl Health {
    /// Record the first failure (later ones are usually consequences of it).
    pub(crate) fn record(&self, msg: String) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(msg);
        }
    }

    /// `Err(Error::Device)` once a failure was recorded.
    pub(crate) fn check(&self) -> Result<()> {
        match &*self.failure.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(m) => Err(Error::Device(format!("the wgpu device failed earlier and cannot be used: {m}"))),
            None => Ok(()),
        }
    }
}

/// Open a device on `adapter` with the adapter's own limits (the defaults are lower: 128 MiB
/// storage bindings need `required_limits: adapter.limits()`, platform.md §1) and install the
/// lost / uncaptured-error callbacks that feed `health`. `features`: optional features to
/// enable (a subset of the adapter's, e.g. `SUBGROUP`).
/// Errors: [`Error::Unavailable`] when the device cannot be created.
pub(crate) async fn open(adapter: &wgpu::Adapter, health: &Arc<Health>, features: wgpu::Features) -> Result<(wgpu::Device, wgpu::Queue)> {
    let desc = wgpu::DeviceDescriptor {
        label: Some("sparkling-wgpu"),
        required_features: features & adapter.features(),
        required_limits: adapter.limits(),
        ..Default::default()
    };
    let (device, queue) =
        adapter.request_device(&desc).await.map_err(|e| Error::Unavailable(format!("cannot open a device on {}: {e}", describe(&adapter.get_info()))))?;
    let h = Arc::clone(health);
    device.set_device_lost_callback(move |reason, msg| h.record(format!("device lost ({reason:?}): {msg}")));
    let h = Arc::clone(health);
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| h.record(format!("{e}"))));
    Ok((device, queue))
}
