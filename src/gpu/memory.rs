//! What the adapter says about its memory, read once when the device opens:
//! the size of its largest device-local heap and, where the driver reports it
//! (`VK_EXT_memory_budget`), the budget this process may use there. wgpu has no
//! query for either (gfx-rs/wgpu#2447), so Vulkan adapters are asked through
//! wgpu-hal's raw handles; Metal, DX12 and GL adapters report none here, and
//! the engine then falls back to a fixed KV pool (see `engine::MemoryPlan`).

/// An adapter's memory as its driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceMemory {
    /// Bytes of the largest device-local heap.
    pub total: u64,
    /// Bytes this process may use there now (the driver's budget less what
    /// the process already holds), where the driver says.
    pub available: Option<u64>,
}

impl DeviceMemory {
    /// The bytes a plan may count on: the budget left where known, else the heap.
    pub fn usable(&self) -> u64 {
        self.available.unwrap_or(self.total).min(self.total)
    }
}

/// The memory of `adapter`, where its backend tells.
pub fn query(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    #[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
    if adapter.get_info().backend == wgpu::Backend::Vulkan {
        return vulkan(adapter);
    }
    let _ = adapter;
    None
}

#[cfg(not(any(target_arch = "wasm32", target_vendor = "apple")))]
fn vulkan(adapter: &wgpu::Adapter) -> Option<DeviceMemory> {
    use ash::vk;
    // SAFETY: `as_hal` is unsafe because the raw handles it exposes must not be
    // used to break wgpu's invariants (destroying or mutating objects it
    // owns). We only read physical-device properties, which Vulkan allows at
    // any time from any thread, and drop the guard before returning.
    let hal = unsafe { adapter.as_hal::<wgpu::hal::api::Vulkan>() }?;
    let shared = hal.shared_instance();
    let instance = shared.raw_instance();
    let pd = hal.raw_physical_device();
    let caps = hal.physical_device_capabilities();
    // SAFETY: `pd` is a valid physical device of `instance` (wgpu enumerated it
    // there and keeps both alive while `hal` is held);
    // vkGetPhysicalDeviceMemoryProperties is Vulkan 1.0 core.
    let props = unsafe { instance.get_physical_device_memory_properties(pd) };
    let heaps = &props.memory_heaps[..(props.memory_heap_count as usize).min(vk::MAX_MEMORY_HEAPS)];
    let (index, heap) = heaps
        .iter()
        .enumerate()
        .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .max_by_key(|(_, h)| h.size)?;
    let budget_ok = caps.supports_extension(ash::ext::memory_budget::NAME)
        && caps.properties().api_version >= vk::API_VERSION_1_1
        && shared.instance_api_version() >= vk::API_VERSION_1_1;
    let available = budget_ok
        .then(|| {
            let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
            let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
            // SAFETY: vkGetPhysicalDeviceMemoryProperties2 is core in Vulkan 1.1,
            // which both the instance and the device support (checked above),
            // and the device supports VK_EXT_memory_budget, so chaining its
            // properties struct is valid; both structs live across the call.
            unsafe { instance.get_physical_device_memory_properties2(pd, &mut props2) };
            let (b, u) = (budget.heap_budget[index], budget.heap_usage[index]);
            (b > 0).then(|| b.saturating_sub(u))
        })
        .flatten();
    Some(DeviceMemory {
        total: heap.size,
        available,
    })
}
