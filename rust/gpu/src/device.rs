//! Finding and opening a device, its buffers, and a pass: kernels recorded
//! into one command buffer and submitted together.
//!
//! wgpu reports most errors to a handler rather than to the call that made
//! them; the handler keeps the first one, and the next submission or read
//! returns it, so a refused command fails its pass instead of panicking.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use ember_gguf::GgmlType;

use crate::error::{GpuError, Result};
use crate::kernels::{AttentionPairs, Kernel, Pipelines, Shareout, Subgroups};

/// What kind of device an adapter is, as the driver says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeviceKind {
    Discrete,
    Integrated,
    Virtual,
    /// A software rasteriser on the CPU (Mesa's lavapipe): correct, not fast.
    Cpu,
    Other,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::Discrete => "discrete GPU",
            DeviceKind::Integrated => "integrated GPU",
            DeviceKind::Virtual => "virtual GPU",
            DeviceKind::Cpu => "CPU (software)",
            DeviceKind::Other => "other",
        }
    }

    /// Which device is taken when none is named: a card before a shared
    /// one, and a software one last.
    fn preference(self) -> u8 {
        match self {
            DeviceKind::Discrete => 0,
            DeviceKind::Integrated => 1,
            DeviceKind::Virtual => 2,
            DeviceKind::Other => 3,
            DeviceKind::Cpu => 4,
        }
    }
}

/// A device as `--list-devices` shows it.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// The name `--device` takes, as llama.cpp names Vulkan devices: Vulkan0, Vulkan1, ...
    pub name: String,
    /// The adapter's own name ("NVIDIA GeForce RTX 4090", "llvmpipe (LLVM 15.0.6, 256 bits)").
    pub description: String,
    pub kind: DeviceKind,
    pub driver: String,
    /// The largest buffer one binding may hold: a weight matrix must fit in it.
    pub max_binding_bytes: u64,
}

fn vulkan_adapters() -> Vec<wgpu::Adapter> {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = wgpu::Backends::VULKAN;
    let instance = wgpu::Instance::new(desc);
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN))
}

fn describe(index: usize, adapter: &wgpu::Adapter) -> DeviceInfo {
    let info = adapter.get_info();
    let limits = adapter.limits();
    let kind = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => DeviceKind::Discrete,
        wgpu::DeviceType::IntegratedGpu => DeviceKind::Integrated,
        wgpu::DeviceType::VirtualGpu => DeviceKind::Virtual,
        wgpu::DeviceType::Cpu => DeviceKind::Cpu,
        wgpu::DeviceType::Other => DeviceKind::Other,
    };
    let driver = [info.driver.as_str(), info.driver_info.as_str()]
        .iter()
        .filter(|s| !s.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
    DeviceInfo {
        name: format!("Vulkan{index}"),
        description: info.name,
        kind,
        driver,
        max_binding_bytes: (limits.max_storage_buffer_binding_size as u64).min(limits.max_buffer_size),
    }
}

/// Every Vulkan device this machine has, in the driver's order.
pub fn list_devices() -> Vec<DeviceInfo> {
    vulkan_adapters().iter().enumerate().map(|(i, a)| describe(i, a)).collect()
}

/// An open device: its queue, its kernels, and the first fault it reported.
pub struct Gpu {
    info: DeviceInfo,
    device: wgpu::Device,
    queue: wgpu::Queue,
    limits: wgpu::Limits,
    pipelines: Pipelines,
    /// Bind groups made before, by kernel and buffers: a decoded token binds
    /// the same ones every time.
    bindings: Mutex<HashMap<(Kernel, Vec<wgpu::Buffer>), wgpu::BindGroup>>,
    /// The mappable buffer reads come back through, grown as needed; a
    /// pass that reads takes it while it records, and gives it back.
    readback: Mutex<Option<wgpu::Buffer>>,
    submits: AtomicU64,
    waits: AtomicU64,
    /// Where the matrix products' inputs are laid out block-major, grown as needed.
    blocked: Mutex<Option<wgpu::Buffer>>,
    /// The spans of a split attention, grown as needed.
    attention_parts: Mutex<Option<wgpu::Buffer>>,
    /// Positions a span of attention holds, where a test sets it.
    attention_span: Option<usize>,
    /// Queries an attention workgroup takes, where a test or bench sets it.
    attention_queries: Option<usize>,
    /// Whether a prompt's products are tiled (a bench times both forms).
    tiles: bool,
    fault: Arc<Mutex<Option<GpuError>>>,
}

impl Gpu {
    /// Opens the device named `name` (`Vulkan1`, case aside), or with none
    /// the one `DeviceKind::preference` ranks first.
    pub fn open(name: Option<&str>) -> Result<Gpu> {
        let adapters = vulkan_adapters();
        if adapters.is_empty() {
            return Err(GpuError::NoDevice);
        }
        let infos: Vec<DeviceInfo> = adapters.iter().enumerate().map(|(i, a)| describe(i, a)).collect();
        let index = match name {
            Some(name) => infos.iter().position(|d| d.name.eq_ignore_ascii_case(name.trim())).ok_or_else(|| {
                GpuError::NoSuchDevice {
                    name: name.to_string(),
                    available: infos
                        .iter()
                        .map(|d| format!("{} ({})", d.name, d.description))
                        .collect::<Vec<_>>()
                        .join(", "),
                }
            })?,
            None => (0..infos.len()).min_by_key(|&i| (infos[i].kind.preference(), i)).expect("not empty"),
        };
        let info = infos[index].clone();
        let adapter = &adapters[index];
        let limits = adapter.limits();
        // A kernel's few numbers travel as immediates (Vulkan's push
        // constants): a buffer for them on every dispatch cost a card tens of
        // microseconds a kernel.
        if !adapter.features().contains(wgpu::Features::IMMEDIATES) || limits.max_immediate_size < MAX_PARAMS_BYTES {
            return Err(GpuError::Open {
                device: info.name.clone(),
                reason: format!("it offers no {MAX_PARAMS_BYTES} bytes of immediates (push constants)"),
            });
        }
        // The products add their threads' sums through subgroup shuffles
        // where the device has them (without a barrier a step).
        let subgroups = Subgroups::of(adapter.features(), adapter.get_info().subgroup_min_size);
        let mut features = wgpu::Features::IMMEDIATES;
        if subgroups.smallest.is_some() {
            features |= wgpu::Features::SUBGROUP;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("ember"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| GpuError::Open { device: info.name.clone(), reason: e.to_string() })?;

        let fault: Arc<Mutex<Option<GpuError>>> = Arc::default();
        let keep = {
            let fault = fault.clone();
            move |e: GpuError| {
                let mut slot = fault.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert(e);
            }
        };
        let on_error = keep.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            on_error(match e {
                wgpu::Error::OutOfMemory { .. } => GpuError::OutOfMemory(e.to_string()),
                _ => GpuError::Device(e.to_string()),
            })
        }));
        device.set_device_lost_callback(move |reason, message| {
            keep(GpuError::Lost(format!("{reason:?}: {message}")));
        });
        Ok(Gpu {
            info,
            device,
            queue,
            limits,
            pipelines: Pipelines::new(subgroups),
            bindings: Mutex::default(),
            readback: Mutex::default(),
            submits: AtomicU64::new(0),
            waits: AtomicU64::new(0),
            blocked: Mutex::default(),
            attention_parts: Mutex::default(),
            attention_span: None,
            attention_queries: None,
            tiles: true,
            fault,
        })
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// Bytes of device memory the live buffers hold, as wgpu's allocator
    /// counts them (None where the backend keeps no count).
    pub fn allocated_bytes(&self) -> Option<u64> {
        self.device.generate_allocator_report().map(|r| r.total_allocated_bytes)
    }

    /// Caps one binding below the device's own limit, so that matrices past
    /// it are held in runs of rows sooner (a card whose driver reports more
    /// than it serves well; the tests, to reach the runs with small matrices).
    pub fn limit_bindings(&mut self, bytes: u64) {
        self.info.max_binding_bytes = self.info.max_binding_bytes.min(bytes);
    }

    /// Reports `fault` as if the device had: the next submit or read fails
    /// with it (how tests reach the paths a lost device takes).
    #[doc(hidden)]
    pub fn inject_fault(&self, fault: GpuError) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(fault);
    }

    /// The first fault the device reported since the last check, if any.
    fn check(&self) -> Result<()> {
        match self.fault.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The most bytes one buffer a kernel binds may hold: the device's
    /// limit, and what the kernels' 32-bit byte offsets reach.
    pub(crate) fn binding_limit(&self) -> u64 {
        self.info.max_binding_bytes.min(u32::MAX as u64)
    }

    pub(crate) fn fits(&self, what: impl FnOnce() -> String, bytes: u64) -> Result<()> {
        let limit = self.binding_limit();
        if bytes > limit {
            return Err(GpuError::TooLarge { what: what(), bytes, limit });
        }
        Ok(())
    }

    /// A storage buffer of `bytes` (rounded up to whole words, and one word
    /// more, so a read of four bytes at the last byte stays inside it),
    /// holding `data` at its start.
    pub(crate) fn storage(&self, label: &str, data: &[u8], bytes: usize) -> Result<wgpu::Buffer> {
        let size = (bytes.div_ceil(4) + 1) * 4;
        // A kept bind group holds its buffers: a session's rings would outlive
        // it there. Buffers are made when sessions and working sets are, so
        // forgetting the kept ones then frees the dropped ones before the new
        // ones take the card's memory, and a decoded token finds its own kept.
        self.bindings.lock().unwrap_or_else(|p| p.into_inner()).clear();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: size as u64,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::OutOfMemory(format!("{label}: {e}")));
        }
        let whole = data.len() / 4 * 4;
        if whole > 0 {
            self.queue.write_buffer(&buf, 0, &data[..whole]);
        }
        if whole < data.len() {
            let mut tail = [0u8; 4];
            tail[..data.len() - whole].copy_from_slice(&data[whole..]);
            self.queue.write_buffer(&buf, whole as u64, &tail);
        }
        self.check()?;
        Ok(buf)
    }

    /// A weight matrix of `rows` rows of `cols`, given in the file's layout
    /// of `ty`, copied to the device in its blocks (their scales set apart
    /// where they would not start on a word: `layout.rs`): in one buffer,
    /// or in runs of whole rows where it is larger than one binding may be
    /// (a large vocabulary's output head).
    pub fn upload_matrix(
        &self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<DeviceMatrix> {
        if !crate::matmul_supports(ty) {
            return Err(GpuError::UnsupportedType { ty });
        }
        if cols % ty.block_size() != 0 {
            return Err(GpuError::Shape(format!("{name}: {cols} columns are not whole blocks of {ty}")));
        }
        let file_row_bytes = ty.row_bytes(cols as u64).expect("whole blocks") as usize;
        if data.len() != rows * file_row_bytes {
            return Err(GpuError::Shape(format!(
                "{name}: {} bytes given for {rows} rows of {cols} {ty} ({} bytes)",
                data.len(),
                rows * file_row_bytes
            )));
        }
        let data = crate::layout::device_rows(ty, cols, data);
        let row_bytes = crate::layout::row_bytes(ty, cols);
        // Room for the word past the end that `storage` adds.
        let per_run = (self.binding_limit().saturating_sub(8) / row_bytes as u64) as usize;
        if per_run == 0 {
            return Err(GpuError::TooLarge {
                what: format!("{name}: one row"),
                bytes: row_bytes as u64,
                limit: self.binding_limit(),
            });
        }
        let mut runs = Vec::new();
        for first in (0..rows).step_by(per_run) {
            let n = per_run.min(rows - first);
            let buf = self.storage(name, &data[first * row_bytes..(first + n) * row_bytes], n * row_bytes)?;
            runs.push(RowRun { first, rows: n, buf });
        }
        Ok(DeviceMatrix { ty, rows, cols, row_bytes, runs })
    }

    /// Matrices of one type and width (`cols` of `ty`; each part its rows
    /// and their bytes) held as one, their rows stacked in order, for the
    /// kernels that take a set of products at once ([`Pass::matmul_gated`],
    /// [`Pass::matmul_split`]); None where they do not fit one binding
    /// together (the caller keeps them apart).
    pub fn upload_stacked(&self, name: &str, ty: GgmlType, cols: usize, parts: &[(usize, &[u8])]) -> Result<Option<StackedMatrix>> {
        if !crate::matmul_supports(ty) {
            return Err(GpuError::UnsupportedType { ty });
        }
        let Some(row_bytes) = ty.row_bytes(cols as u64).map(|b| b as usize) else {
            return Err(GpuError::Shape(format!("{name}: {cols} columns are not whole blocks of {ty}")));
        };
        if let Some((i, (rows, b))) = parts.iter().enumerate().find(|(_, (rows, b))| b.len() != rows * row_bytes) {
            return Err(GpuError::Shape(format!(
                "{name}: part {i} gives {} bytes for {rows} rows of {cols} {ty} ({} bytes)",
                b.len(),
                rows * row_bytes
            )));
        }
        let bytes: usize = parts.iter().map(|(_, b)| b.len()).sum();
        if bytes as u64 + 8 > self.binding_limit() {
            return Ok(None);
        }
        let rows = parts.iter().map(|(r, _)| r).sum();
        let data: Vec<u8> = parts.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        let m = self.upload_matrix(name, ty, rows, cols, &data)?;
        debug_assert_eq!(m.runs.len(), 1);
        Ok(Some(StackedMatrix { m, parts: parts.iter().map(|(r, _)| *r).collect() }))
    }

    /// f32 values on the device.
    pub fn upload(&self, label: &str, values: &[f32]) -> Result<DeviceBuffer> {
        self.fits(|| label.to_string(), values.len() as u64 * 4 + 4)?;
        let buf = self.storage(label, bytemuck::cast_slice(values), values.len() * 4)?;
        Ok(DeviceBuffer { buf, len: values.len() })
    }

    /// `len` f32 values on the device, zeroed.
    pub fn zeros(&self, label: &str, len: usize) -> Result<DeviceBuffer> {
        self.fits(|| label.to_string(), len as u64 * 4 + 4)?;
        // A new buffer is zeroed by wgpu.
        let buf = self.storage(label, &[], len * 4)?;
        Ok(DeviceBuffer { buf, len })
    }

    /// Writes `values` at the start of `to`, before any pass submitted after.
    pub fn write(&self, to: &DeviceBuffer, values: &[f32]) -> Result<()> {
        if values.len() > to.len {
            return Err(GpuError::Shape(format!("writing {} values to a buffer of {}", values.len(), to.len)));
        }
        if !values.is_empty() {
            self.queue.write_buffer(&to.buf, 0, bytemuck::cast_slice(values));
        }
        self.check()
    }

    /// The buffer's values, once every pass submitted before has run.
    pub fn read(&self, from: &DeviceBuffer) -> Result<Vec<f32>> {
        self.read_first(from, from.len)
    }

    /// The first `n` of the buffer's values, once every pass submitted before has run.
    pub fn read_first(&self, from: &DeviceBuffer, n: usize) -> Result<Vec<f32>> {
        if n > from.len {
            return Err(GpuError::Shape(format!("reading {n} values of a buffer of {}", from.len)));
        }
        Ok(bytemuck::cast_slice::<u8, f32>(&self.read_bytes(&from.buf, 0, n as u64 * 4)?).to_vec())
    }

    /// The first `n` (index, value) pairs [`Pass::top_k`] wrote to `from`,
    /// once every pass submitted before has run.
    pub fn read_top(&self, from: &DeviceBuffer, n: usize) -> Result<Vec<(u32, f32)>> {
        let words = self.read_first(from, 2 * n)?;
        Ok(words.chunks_exact(2).map(|w| (w[0].to_bits(), w[1])).collect())
    }

    /// The first `rows` rows of a cache layer's keys and values in the
    /// CPU's cache format (f16 rows, or rows of Q8_0 blocks: an f16 scale
    /// and 32 quants each), once every pass submitted before has run.
    pub fn read_kv(&self, layer: &DeviceKvLayer, rows: usize) -> Result<(Vec<u8>, Vec<u8>)> {
        if rows > layer.ring {
            return Err(GpuError::Shape(format!("reading {rows} rows of a cache of {}", layer.ring)));
        }
        let read = |buf: &wgpu::Buffer, width: usize| -> Result<Vec<u8>> {
            match layer.format {
                KvFormat::F16 => self.read_bytes(buf, 0, (rows * width * 2) as u64),
                KvFormat::Q8_0 => {
                    let quants = self.read_bytes(buf, 0, (rows * width) as u64)?;
                    let block = layer.format.unit();
                    let scales = self.read_bytes(buf, (layer.ring * width) as u64, (rows * width / block * 4) as u64)?;
                    let scales: &[f32] = bytemuck::cast_slice(&scales);
                    Ok(quants
                        .chunks_exact(block)
                        .zip(scales)
                        .flat_map(|(q, &d)| half::f16::from_f32(d).to_le_bytes().into_iter().chain(q.iter().copied()))
                        .collect())
                }
            }
        };
        Ok((read(&layer.k, layer.width_k)?, read(&layer.v, layer.width_v)?))
    }

    /// Writes whole rows of keys and values (in the CPU's cache format, as
    /// [`read_kv`](Self::read_kv) gives them) at the start of a cache layer.
    pub fn write_kv(&self, layer: &DeviceKvLayer, k: &[u8], v: &[u8]) -> Result<()> {
        let (kr, vr) = (layer.format.host_bytes(layer.width_k), layer.format.host_bytes(layer.width_v));
        if !k.len().is_multiple_of(kr) || !v.len().is_multiple_of(vr) || k.len() / kr != v.len() / vr || k.len() / kr > layer.ring {
            return Err(GpuError::Shape(format!(
                "writing {} bytes of keys and {} of values to a cache of {} rows of {kr} and {vr}",
                k.len(),
                v.len(),
                layer.ring
            )));
        }
        let write = |buf: &wgpu::Buffer, width: usize, bytes: &[u8]| match layer.format {
            // Rows are f16 pairs, so every length is a whole number of words.
            KvFormat::F16 => self.queue.write_buffer(buf, 0, bytes),
            KvFormat::Q8_0 => {
                let blocks = bytes.chunks_exact(layer.format.host_bytes(layer.format.unit()));
                let quants: Vec<u8> = blocks.clone().flat_map(|b| b[2..].iter().copied()).collect();
                let scales: Vec<f32> = blocks.map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
                self.queue.write_buffer(buf, 0, &quants);
                self.queue.write_buffer(buf, (layer.ring * width) as u64, bytemuck::cast_slice(&scales));
            }
        };
        if !k.is_empty() {
            write(&layer.k, layer.width_k, k);
            write(&layer.v, layer.width_v, v);
        }
        self.check()
    }

    /// `size` bytes of `from` from byte `at` (both multiples of 4), once
    /// every pass submitted before has run.
    fn read_bytes(&self, from: &wgpu::Buffer, at: u64, size: u64) -> Result<Vec<u8>> {
        let mut p = self.pass();
        p.read_back_bytes(from, at, size);
        let (_, words) = p.submit_and_read()?;
        Ok(bytemuck::cast_slice(&words).to_vec())
    }

    fn submit(&self, encoder: wgpu::CommandEncoder) -> Result<()> {
        self.queue.submit([encoder.finish()]);
        self.submits.fetch_add(1, Ordering::Relaxed);
        self.check()
    }

    /// Command buffers submitted so far: a pass and its reads are one.
    pub fn submits(&self) -> u64 {
        self.submits.load(Ordering::Relaxed)
    }

    /// Times the host has waited for the device so far, each for every
    /// read a pass asked for.
    pub fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    /// Maps every staging buffer of `reads` once their copies have run (one
    /// wait for them all), and gathers the reads' values in order.
    fn map_reads(&self, reads: &Reads) -> Result<Vec<f32>> {
        let (tx, rx) = mpsc::channel();
        let used = |i: usize| if i + 1 == reads.staging.len() { reads.filled } else { reads.staging[i].size() };
        for (i, b) in reads.staging.iter().enumerate() {
            let tx = tx.clone();
            b.slice(..used(i)).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        }
        drop(tx);
        self.waits.fetch_add(1, Ordering::Relaxed);
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Device(e.to_string()))?;
        self.check()?;
        for _ in &reads.staging {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(GpuError::Device(format!("reading a buffer back: {e}"))),
                Err(_) => return Err(GpuError::Lost("the read back was never answered".into())),
            }
        }
        let total: u64 = reads.places.iter().map(|p| p.2).sum();
        let mut words = vec![0f32; (total / 4) as usize];
        let mut at = 0;
        let views = (0..reads.staging.len())
            .map(|i| reads.staging[i].slice(..used(i)).get_mapped_range().map_err(|e| GpuError::Device(e.to_string())))
            .collect::<Result<Vec<_>>>()?;
        for &(i, from, size) in &reads.places {
            let to = &mut words[at..at + (size / 4) as usize];
            bytemuck::cast_slice_mut(to).copy_from_slice(&views[i][from as usize..(from + size) as usize]);
            at += to.len();
        }
        drop(views);
        reads.staging.iter().for_each(wgpu::Buffer::unmap);
        Ok(words)
    }

    /// The working buffer in `slot`, made again larger when it holds fewer
    /// than `floats`.
    fn grown(&self, slot: &Mutex<Option<wgpu::Buffer>>, label: &str, floats: usize) -> Result<wgpu::Buffer> {
        let mut kept = slot.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = kept.as_ref().filter(|b| b.size() >= floats as u64 * 4) {
            return Ok(b.clone());
        }
        self.fits(|| label.to_string(), floats as u64 * 4 + 4)?;
        // A pass recorded before keeps the smaller one alive as long as it needs it.
        let buf = self.storage(label, &[], floats * 4)?;
        *kept = Some(buf.clone());
        Ok(buf)
    }

    /// The fewest invocations a subgroup holds where the kernels add
    /// through subgroup shuffles; None where they do not.
    pub fn subgroup_size(&self) -> Option<u32> {
        self.pipelines.subgroups().smallest
    }

    /// Keeps the kernels from subgroup operations, as on a device without
    /// them (the tests, to hold both forms to the same bits; the benches,
    /// to time both).
    pub fn without_subgroups(&mut self) {
        self.pipelines = Pipelines::new(Subgroups::default());
        // A kept bind group belongs to the layout of the pipeline it was made for.
        self.bindings.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// Keeps a prompt's products from the tiled form, as the row-parallel
    /// form takes a few inputs (the benches, to time both forms on one
    /// device; the outputs are the same bits).
    pub fn without_tiles(&mut self) {
        self.tiles = false;
    }

    /// How a product of `rows` rows of `ty` over `n` inputs is shared out.
    fn shareout(&self, n: usize, rows: usize, ty: GgmlType) -> Shareout {
        Shareout::of(n, rows, ty, self.tiles)
    }

    /// Shares every attention's blocks of positions out over workgroups of
    /// `positions` each (rounded up to whole blocks of 64), their sums
    /// folded after, however few positions and however many queries there
    /// are (the tests, to reach the shared-out path with small caches; the
    /// outputs are the same bits).
    pub fn split_attention_every(&mut self, positions: usize) {
        self.attention_span = Some(positions.max(1).next_multiple_of(ATTENTION_BLOCK));
    }

    /// Gives an attention workgroup up to `queries` neighbouring queries
    /// wherever each query's blocks are one workgroup's, however few
    /// workgroups that leaves (the tests, to reach that form with small
    /// prompts; the benches, to time it; the outputs are the same bits).
    pub fn attention_queries(&mut self, queries: usize) {
        self.attention_queries = Some(queries);
    }

    /// A layer's cache of `ring` rows of keys `width_k` and values
    /// `width_v` wide, kept as `format` (rows of whole units: f16 pairs, or
    /// Q8_0 blocks of 32).
    pub fn kv_layer(&self, ring: usize, width_k: usize, width_v: usize, format: KvFormat) -> Result<DeviceKvLayer> {
        let unit = format.unit();
        if ring == 0 || !width_k.is_multiple_of(unit) || !width_v.is_multiple_of(unit) {
            return Err(GpuError::Shape(format!(
                "a {format:?} cache of {ring} rows of keys {width_k} and values {width_v} wide: rows must be whole units of {unit}"
            )));
        }
        let (kb, vb) = (format.device_bytes(ring, width_k), format.device_bytes(ring, width_v));
        self.fits(|| "the keys of a cache layer".into(), kb as u64 + 4)?;
        self.fits(|| "the values of a cache layer".into(), vb as u64 + 4)?;
        let k = self.storage("keys", &[], kb)?;
        let v = self.storage("values", &[], vb)?;
        Ok(DeviceKvLayer { ring, width_k, width_v, format, k, v })
    }

    /// A pass: kernels recorded in order, run when it is submitted.
    pub fn pass(&self) -> Pass<'_> {
        Pass {
            gpu: self,
            encoder: self.device.create_command_encoder(&Default::default()),
            compute: None,
            blocked: None,
            pending: None,
            kernels: 0,
            reads: Reads::default(),
        }
    }
}

/// f32 values on the device.
pub struct DeviceBuffer {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) len: usize,
}

impl DeviceBuffer {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A weight matrix on the device, in its file format: `rows` outputs of
/// `cols` inputs, in runs of whole rows of at most one binding each.
pub struct DeviceMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
    runs: Vec<RowRun>,
}

/// Matrices held as one, their rows stacked ([`Gpu::upload_stacked`]).
pub struct StackedMatrix {
    m: DeviceMatrix,
    /// Rows of each part, in order.
    parts: Vec<usize>,
}

impl StackedMatrix {
    /// Bytes it holds on the device.
    pub fn bytes(&self) -> u64 {
        self.m.bytes()
    }

    /// Rows of each part, in order.
    pub fn parts(&self) -> &[usize] {
        &self.parts
    }
}

struct RowRun {
    first: usize,
    rows: usize,
    buf: wgpu::Buffer,
}

impl DeviceMatrix {
    /// Bytes it holds on the device.
    pub fn bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.buf.size()).sum()
    }

    /// Buffers it is held in (more than one past the binding limit).
    pub fn runs(&self) -> usize {
        self.runs.len()
    }
}

/// One layer's keys and values on the device, as rows of `width_k` and
/// `width_v` (every key-value head side by side) in `format`; the row of
/// position p is p % ring, so a sliding-window layer keeps a ring and a full
/// one a row per position of the context.
pub struct DeviceKvLayer {
    pub ring: usize,
    pub width_k: usize,
    pub width_v: usize,
    pub format: KvFormat,
    k: wgpu::Buffer,
    v: wgpu::Buffer,
}

/// How a cache layer keeps its keys and values on the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvFormat {
    /// Rows of f16.
    F16,
    /// Rows of Q8_0 blocks, quantized as the CPU's cache quantizes them: the
    /// ring's quants, a byte an element, then every block's f16 scale held
    /// in a word of its own (`kv_write_q8_0.wgsl`), so that a thread storing
    /// a block writes whole words.
    Q8_0,
}

impl KvFormat {
    /// The file type whose blocks the CPU's cache of this format holds.
    fn file_type(self) -> GgmlType {
        match self {
            KvFormat::F16 => GgmlType::F16,
            KvFormat::Q8_0 => GgmlType::Q8_0,
        }
    }

    /// Elements one thread stores (`kv_write_*.wgsl`'s KV_UNIT): a row is
    /// whole units.
    pub fn unit(self) -> usize {
        match self {
            KvFormat::F16 => 2,
            KvFormat::Q8_0 => self.file_type().block_size(),
        }
    }

    /// Bytes `rows` rows of `width` take on the device: the CPU's, but for
    /// Q8_0's scales, a word each.
    fn device_bytes(self, rows: usize, width: usize) -> usize {
        match self {
            KvFormat::F16 => rows * self.host_bytes(width),
            KvFormat::Q8_0 => rows * width + rows * width / self.unit() * 4,
        }
    }

    /// Bytes a row of `width` takes in the CPU's cache format.
    fn host_bytes(self, width: usize) -> usize {
        self.file_type().row_bytes(width as u64).expect("rows of whole units") as usize
    }
}

/// How a layer's heads are rotated: the first `half` pairs of each
/// `head_dim`-wide head, adjacent (2i, 2i + 1) or halves (i, i + half).
#[derive(Clone, Copy, Debug)]
pub struct Rotation {
    pub head_dim: usize,
    pub half: usize,
    pub halves: bool,
}

/// A gate's activation: the FFN's, or an attention output's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation (ggml's `gelu`).
    GeluTanh,
    /// 1 / (1 + e^-x) (Qwen3.5's gated attention).
    Sigmoid,
}

/// The shape of one attention call: `t` queries of a sequence at positions
/// `start..start + t`, rows `row0..row0 + t` of the query and output
/// buffers (a pass over several sequences holds theirs one after another),
/// their heads `head_dim_k` wide in rows of `n_head * head_dim_k`, each
/// group of `n_head / n_head_kv` heads reading one key-value head.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub t: usize,
    pub start: usize,
    pub row0: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

/// The widest head, of keys or of values, the attention kernel holds (its
/// MAX_PER_THREAD * 64: the value elements a thread sums, and the width of
/// the queries it stages).
pub const MAX_HEAD_DIM: usize = 512;

/// Positions the attention kernel scores at a time (its WG, and
/// `attention_blocks.wgsl`'s BLOCK_POSITIONS): blocks counted from position 0.
const ATTENTION_BLOCK: usize = 64;

/// Workgroups an attention call should have at least: where a workgroup a
/// (query, head) gives fewer, a query's blocks are shared out over
/// workgroups until it does (a decoded token has a workgroup a head).
const ATTENTION_GROUPS: usize = 512;

/// The most floats the blocks' sums of a shared-out attention may take (64
/// MiB): past it, a workgroup a (query, head) walks all its blocks.
const MAX_ATTENTION_PARTS: usize = 16 << 20;

/// The most bytes of numbers one kernel takes (the widest `Params`).
const MAX_PARAMS_BYTES: u32 = 64;

/// Bind groups kept at most (the cache is also emptied whenever a buffer is
/// made: see `Gpu::storage`).
const MAX_CACHED_BINDINGS: usize = 4096;

/// Kernels recorded into one command buffer, in one compute pass between
/// the copies.
pub struct Pass<'g> {
    gpu: &'g Gpu,
    encoder: wgpu::CommandEncoder,
    compute: Option<wgpu::ComputePass<'static>>,
    /// The inputs the block-major buffer holds now, so the products that
    /// read the same ones (q, k and v; gate and up) lay them out once.
    blocked: Option<Blocked>,
    /// A kernel not recorded yet, so that the next may take it in (see
    /// [`Pending`]); anything else records it first.
    pending: Option<Pending>,
    /// Kernels recorded so far.
    kernels: usize,
    /// The copies into mappable memory that the pass's reads asked for.
    reads: Reads,
}

/// Where a pass's reads land: the mappable buffers they are copied into
/// (the last still filling; another is made only when one fills) and
/// each read's place, in the order asked.
#[derive(Default)]
struct Reads {
    staging: Vec<wgpu::Buffer>,
    /// Bytes of the last staging buffer taken.
    filled: u64,
    /// (staging buffer, byte offset, bytes) of each read.
    places: Vec<(usize, u64, u64)>,
}

/// What a pass holds back for the kernel after it (each form of
/// `rms_norm.wgsl` rounds as the kernels it stands for).
enum Pending {
    /// x[..n] += b[..n], a residual: the norm of its sum takes it in.
    Add { x: wgpu::Buffer, b: wgpu::Buffer, n: usize },
    /// A norm (its residual add taken in, or not): a product reading its
    /// output takes in the laying out of it.
    Norm(PendingNorm),
}

struct PendingNorm {
    x: wgpu::Buffer,
    added: Option<wgpu::Buffer>,
    weight: wgpu::Buffer,
    out: wgpu::Buffer,
    rows: usize,
    width: usize,
    eps: f32,
}

impl PendingNorm {
    /// Records it, its output laid out block-major into `laid_out` as well
    /// for blocks of `block` where one is given.
    fn record(self, pass: &mut Pass<'_>, laid_out: Option<(&wgpu::Buffer, usize)>) {
        let max = pass.max_groups();
        let (gx, gy) = (self.rows.min(max), self.rows.div_ceil(max));
        let block = laid_out.map_or(1, |(_, block)| block);
        let params = [self.width as u32, self.rows as u32, self.eps.to_bits(), gx as u32, block as u32, 0, 0, 0];
        let mut buffers = vec![&self.x, &self.weight, &self.out];
        buffers.extend(&self.added);
        buffers.extend(laid_out.map(|(b, _)| b));
        let kernel = Kernel::RmsNorm { added: self.added.is_some(), laid_out: laid_out.is_some() };
        pass.dispatch(kernel, &buffers, &params, [gx as u32, gy as u32, 1]);
    }
}

struct Blocked {
    from: wgpu::Buffer,
    n: usize,
    cols: usize,
    block: usize,
    to: wgpu::Buffer,
}

impl Pass<'_> {
    pub(crate) fn dispatch(&mut self, kernel: Kernel, buffers: &[&wgpu::Buffer], params: &[u32], groups: [u32; 3]) {
        self.record_pending();
        let gpu = self.gpu;
        debug_assert!(params.len() * 4 <= MAX_PARAMS_BYTES as usize);
        // A kernel that binds the inputs laid out may write them.
        for &b in buffers {
            self.may_write(b);
        }
        let pipeline = gpu.pipelines.get(&gpu.device, kernel).expect("a kernel with a source");
        let bind = {
            let mut cache = gpu.bindings.lock().unwrap_or_else(|p| p.into_inner());
            let key = (kernel, buffers.iter().map(|&b| b.clone()).collect::<Vec<_>>());
            if let Some(bind) = cache.get(&key) {
                bind.clone()
            } else {
                let entries: Vec<wgpu::BindGroupEntry> = buffers
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry { binding: i as u32, resource: b.as_entire_binding() })
                    .collect();
                let bind = gpu.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &entries,
                });
                if cache.len() >= MAX_CACHED_BINDINGS {
                    cache.clear();
                }
                cache.insert(key, bind.clone());
                bind
            }
        };
        let encoder = &mut self.encoder;
        let cpass = self.compute.get_or_insert_with(|| encoder.begin_compute_pass(&Default::default()).forget_lifetime());
        cpass.set_pipeline(&pipeline);
        cpass.set_bind_group(0, &bind, &[]);
        cpass.set_immediates(0, bytemuck::cast_slice(params));
        cpass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        self.kernels += 1;
    }

    /// The block `m`'s product over `n` inputs reads them laid out in, for
    /// a kernel that writes them laid out ([`Pass::attention_laid_out`],
    /// [`Pass::matmul_gated_laid_out`]).
    pub fn inputs_block(&self, m: &DeviceMatrix, n: usize) -> usize {
        self.gpu.shareout(n, m.rows, m.ty).inputs_block(m.ty)
    }

    pub(crate) fn max_groups(&self) -> usize {
        self.gpu.limits.max_compute_workgroups_per_dimension as usize
    }

    /// y[c] = w · x[c] for the `n` rows c of x (each `w.cols` wide); y's
    /// rows are `w.rows` wide.
    pub fn matmul(&mut self, w: &DeviceMatrix, x: &DeviceBuffer, n: usize, y: &DeviceBuffer) -> Result<()> {
        if n == 0 || x.len < n * w.cols || y.len < n * w.rows {
            return Err(GpuError::Shape(format!(
                "matmul of {} x {} over {n} rows: x holds {}, y holds {}",
                w.rows, w.cols, x.len, y.len
            )));
        }
        let form = self.gpu.shareout(n, w.rows, w.ty);
        let per_group = form.rows_a_group(w.ty);
        let (inputs, _) = self.row_product_groups(w, x, n, w.rows, form, per_group)?;
        for run in &w.runs {
            let groups = self.product_grid(run.rows, n, per_group, form.inputs_a_group(w.ty))?;
            // y's rows are the whole matrix's; this run writes its own span of them.
            let params = [run.rows, w.cols, n, w.row_bytes, groups[0] as usize, w.cols, w.rows, run.first].map(|v| v as u32);
            self.dispatch(Kernel::Matmul(w.ty, form), &[&run.buf, &inputs, &y.buf], &params, groups);
        }
        Ok(())
    }

    /// out[c] = act(gate · x[c], up · x[c]) for the `n` rows c of x, `w`
    /// the gate and the up projection stacked: the two products and the
    /// activation of a gated feed-forward in one kernel, each output as
    /// [`Pass::matmul`] twice and [`Pass::gated`] give it.
    pub fn matmul_gated(&mut self, w: &StackedMatrix, act: Activation, x: &DeviceBuffer, n: usize, out: &DeviceBuffer) -> Result<()> {
        self.matmul_gated_laid_out(w, act, x, n, out, 1)
    }

    /// [`Pass::matmul_gated`], its output laid out for a product over
    /// blocks of `block`, which then reads it in place.
    pub fn matmul_gated_laid_out(
        &mut self,
        w: &StackedMatrix,
        act: Activation,
        x: &DeviceBuffer,
        n: usize,
        out: &DeviceBuffer,
        block: usize,
    ) -> Result<()> {
        let rows = match w.parts[..] {
            [gate, up] if gate == up => gate,
            _ => return Err(GpuError::Shape(format!("a gated product of parts of {:?} rows", w.parts))),
        };
        if out.len < n * rows || block == 0 || rows % block != 0 {
            return Err(GpuError::Shape(format!(
                "gated matmul of {rows} rows over {n} inputs laid out in blocks of {block}: out holds {}",
                out.len
            )));
        }
        // A workgroup takes as many gate rows as up rows.
        let form = self.gpu.shareout(n, w.m.rows, w.m.ty);
        let per_group = form.rows_a_group(w.m.ty) / 2;
        let (inputs, groups) = self.row_product_groups(&w.m, x, n, rows, form, per_group)?;
        let params = [rows, w.m.cols, n, w.m.row_bytes, groups[0] as usize, w.m.cols, block, 0].map(|v| v as u32);
        let kernel = Kernel::MatmulGated(w.m.ty, form, act);
        self.dispatch(kernel, &[&w.m.runs[0].buf, &inputs, &out.buf], &params, groups);
        if block > 1 {
            self.inputs_laid_out(out, n, rows, block);
        }
        Ok(())
    }

    /// y[i][c] = w_i · x[c] for the `n` rows c of x, `w` three matrices
    /// stacked (an attention layer's queries, keys and values): the three
    /// products in one kernel, each output as [`Pass::matmul`] gives it.
    pub fn matmul_split(&mut self, w: &StackedMatrix, x: &DeviceBuffer, n: usize, y: [&DeviceBuffer; 3]) -> Result<()> {
        let [r0, r1, r2] = w.parts[..] else {
            return Err(GpuError::Shape(format!("a product split three ways of parts of {:?} rows", w.parts)));
        };
        if y.iter().zip([r0, r1, r2]).any(|(b, rows)| b.len < n * rows) {
            return Err(GpuError::Shape(format!("matmul split into {:?} rows over {n} inputs: an output is short", w.parts)));
        }
        let form = self.gpu.shareout(n, w.m.rows, w.m.ty);
        let per_group = form.rows_a_group(w.m.ty);
        let (inputs, groups) = self.row_product_groups(&w.m, x, n, w.m.rows, form, per_group)?;
        let params = [w.m.rows, w.m.cols, n, w.m.row_bytes, groups[0] as usize, w.m.cols, r0, r1].map(|v| v as u32);
        let buffers = [&w.m.runs[0].buf, &inputs, &y[0].buf, &y[1].buf, &y[2].buf];
        self.dispatch(Kernel::MatmulSplit(w.m.ty, form), &buffers, &params, groups);
        Ok(())
    }

    /// The inputs laid out for a product of `m` over `n` of them shared out
    /// as `form`, and its workgroups: `rows` rows, `per_group` to a workgroup.
    fn row_product_groups(
        &mut self,
        m: &DeviceMatrix,
        x: &DeviceBuffer,
        n: usize,
        rows: usize,
        form: Shareout,
        per_group: usize,
    ) -> Result<(wgpu::Buffer, [u32; 3])> {
        if n == 0 || x.len < n * m.cols {
            return Err(GpuError::Shape(format!("a product of {} columns over {n} rows: x holds {}", m.cols, x.len)));
        }
        let groups = self.product_grid(rows, n, per_group, form.inputs_a_group(m.ty))?;
        Ok((self.block_inputs(x, n, m.cols, form.inputs_block(m.ty))?, groups))
    }

    /// The workgroups of a product of `rows` rows, `per_group` to a
    /// workgroup (spread over x and y past the dispatch limit), over `n`
    /// inputs, `inputs_per_group` a workgroup along z (each block
    /// dequantized once for them).
    fn product_grid(&self, rows: usize, n: usize, per_group: usize, inputs_per_group: usize) -> Result<[u32; 3]> {
        let max = self.max_groups();
        let col_groups = n.div_ceil(inputs_per_group);
        let groups = rows.div_ceil(per_group);
        if col_groups > max || groups > max * max {
            return Err(GpuError::Shape(format!("a product of {rows} rows over {n} inputs is past the dispatch limit of {max}")));
        }
        let groups_x = groups.min(max);
        Ok([groups_x as u32, groups.div_ceil(groups_x) as u32, col_groups as u32])
    }

    /// Kernels recorded so far (one held back is not, yet).
    pub fn kernels(&self) -> usize {
        self.kernels
    }

    /// Records the kernel held back and ends the open compute pass: what
    /// comes next (a copy, or the end of the pass) is recorded after both.
    fn end_compute(&mut self) {
        self.record_pending();
        self.compute = None;
    }

    /// Records the kernel held back, if there is one, before what comes next.
    fn record_pending(&mut self) {
        match self.pending.take() {
            Some(Pending::Add { x, b, n }) => {
                let (groups, threads_x) = self.spread(n, "an add").expect("checked when held back");
                self.dispatch(Kernel::AddInPlace, &[&x, &b], &[n as u32, threads_x, n as u32, 0], groups);
            }
            Some(Pending::Norm(norm)) => norm.record(self, None),
            None => {}
        }
    }

    /// Says that the first `n` rows of `cols` of `x` are laid out for a
    /// product over blocks of `block` already (by the kernels that wrote
    /// them: [`Pass::attention_laid_out`], [`Pass::matmul_gated_laid_out`]),
    /// so that the next product over them reads them in place. Until a
    /// kernel writes `x` again; nothing may read its rows as they are.
    pub fn inputs_laid_out(&mut self, x: &DeviceBuffer, n: usize, cols: usize, block: usize) {
        self.record_pending();
        self.blocked = Some(Blocked { from: x.buf.clone(), n, cols, block, to: x.buf.clone() });
    }

    /// Forgets the block-major inputs if they were laid out from `buf`,
    /// which what is recorded next may write.
    fn may_write(&mut self, buf: &wgpu::Buffer) {
        if self.blocked.as_ref().is_some_and(|b| b.from == *buf) {
            self.blocked = None;
        }
    }

    /// The first `n` rows of `cols` of `x` laid out block-major for the
    /// products (see `block_inputs.wgsl`), unless the buffer holds them
    /// already; `x` itself for a block of 1 (rows as they are).
    fn block_inputs(&mut self, x: &DeviceBuffer, n: usize, cols: usize, block: usize) -> Result<wgpu::Buffer> {
        if let Some(b) = self.blocked.as_ref().filter(|b| b.from == x.buf) {
            if (b.n, b.cols, b.block) == (n, cols, block) {
                return Ok(b.to.clone());
            }
            if b.to == x.buf && b.block != 1 {
                return Err(GpuError::Shape(format!(
                    "a product reads {n} rows of {cols} in blocks of {block}, laid out in place for {} rows of {} in blocks of {}",
                    b.n, b.cols, b.block
                )));
            }
        }
        if block == 1 {
            return Ok(x.buf.clone());
        }
        let to = self.gpu.grown(&self.gpu.blocked, "block-major inputs", n * cols)?;
        let norm_of_x = |p: &mut Pending| matches!(p, Pending::Norm(m) if m.out == x.buf && (m.rows, m.width) == (n, cols));
        if let Some(Pending::Norm(norm)) = self.pending.take_if(norm_of_x) {
            // The norm that writes these inputs lays them out as it goes.
            norm.record(self, Some((&to, block)));
            self.blocked = Some(Blocked { from: x.buf.clone(), n, cols, block, to: to.clone() });
            return Ok(to);
        }
        let (groups, threads_x) = self.spread(n * cols, "laying out a product's inputs")?;
        let params = [(n * cols) as u32, threads_x, cols as u32, block as u32];
        self.dispatch(Kernel::BlockInputs, &[&x.buf, &to], &params, groups);
        self.blocked = Some(Blocked { from: x.buf.clone(), n, cols, block, to: to.clone() });
        Ok(to)
    }

    /// out = x / rms(x) * weight, over `rows` rows of `weight.len()`.
    pub fn rms_norm(
        &mut self,
        x: &DeviceBuffer,
        weight: &DeviceBuffer,
        out: &DeviceBuffer,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let width = weight.len;
        if rows == 0 || width == 0 || x.len < rows * width || out.len < rows * width {
            return Err(GpuError::Shape(format!(
                "rms_norm of {rows} rows of {width}: x holds {}, out holds {}",
                x.len, out.len
            )));
        }
        let max = self.max_groups();
        if rows.div_ceil(max) > max {
            return Err(GpuError::Shape(format!("rms_norm of {rows} rows is past the dispatch limit")));
        }
        // Not where the add's values are the norm's output too (a post-norm's,
        // in the buffer this norm writes): a kernel binds a buffer once.
        let sum_of_x = |p: &mut Pending| matches!(p, Pending::Add { x: ax, b, n } if *ax == x.buf && *n == rows * width && *b != out.buf);
        let added = match self.pending.take_if(sum_of_x) {
            Some(Pending::Add { b, .. }) => Some(b),
            _ => None,
        };
        self.record_pending();
        // Held back, but the inputs laid out from what it writes are stale now.
        self.may_write(&out.buf);
        if added.is_some() {
            self.may_write(&x.buf);
        }
        let (x, weight, out) = (x.buf.clone(), weight.buf.clone(), out.buf.clone());
        self.pending = Some(Pending::Norm(PendingNorm { x, added, weight, out, rows, width, eps }));
        Ok(())
    }

    /// Groups of 64 threads for `n` threads, spread over x and y past the
    /// dispatch limit; returns the groups and the threads along x.
    pub(crate) fn spread(&self, n: usize, what: &str) -> Result<([u32; 3], u32)> {
        let groups = n.div_ceil(64).max(1);
        let max = self.max_groups();
        let gx = groups.min(max);
        let gy = groups.div_ceil(gx);
        if gy > max {
            return Err(GpuError::Shape(format!("{what} of {n} values is past the dispatch limit")));
        }
        Ok(([gx as u32, gy as u32, 1], (gx * 64) as u32))
    }

    /// out = act(gate) * up, over `n` values.
    pub fn gated(
        &mut self,
        act: Activation,
        gate: &DeviceBuffer,
        up: &DeviceBuffer,
        out: &DeviceBuffer,
        n: usize,
    ) -> Result<()> {
        self.gated_rows(act, gate, up, n, 0, out, 1, n)
    }

    /// out = act(gate) * up over `rows` rows of `width`, the up values of
    /// row r at `r * up_stride + up_at` (one slice of wider rows).
    #[allow(clippy::too_many_arguments)]
    pub fn gated_rows(
        &mut self,
        act: Activation,
        gate: &DeviceBuffer,
        up: &DeviceBuffer,
        up_stride: usize,
        up_at: usize,
        out: &DeviceBuffer,
        rows: usize,
        width: usize,
    ) -> Result<()> {
        let n = rows * width;
        if n == 0 || gate.len < n || out.len < n || up_at + width > up_stride || up.len < (rows - 1) * up_stride + up_at + width {
            return Err(GpuError::Shape(format!(
                "gated activation of {rows} rows of {width} (up at {up_at} of rows of {up_stride}): the buffers hold {}, {} and {}",
                gate.len, up.len, out.len
            )));
        }
        let kernel = match act {
            Activation::Silu => Kernel::SiluMul,
            Activation::GeluTanh => Kernel::GeluMul,
            Activation::Sigmoid => Kernel::SigmoidMul,
        };
        let (groups, threads_x) = self.spread(n, "a gated activation")?;
        let params = [n as u32, threads_x, width as u32, up_stride as u32, up_at as u32, 0, 0, 0];
        self.dispatch(kernel, &[&gate.buf, &up.buf, &out.buf], &params, groups);
        Ok(())
    }

    /// x *= s over the first `n` values.
    pub fn scale(&mut self, x: &DeviceBuffer, s: f32, n: usize) -> Result<()> {
        if n == 0 || x.len < n {
            return Err(GpuError::Shape(format!("scaling {n} values of {}", x.len)));
        }
        let (groups, threads_x) = self.spread(n, "a scale")?;
        self.dispatch(Kernel::Scale, &[&x.buf], &[n as u32, threads_x, s.to_bits(), 0], groups);
        Ok(())
    }

    /// x += b over `n` values, b repeating every `b.len()` values where it
    /// is shorter (a bias added to every row).
    pub fn add_to(&mut self, x: &DeviceBuffer, b: &DeviceBuffer, n: usize) -> Result<()> {
        if n == 0 || x.len < n || b.len == 0 || (b.len < n && n % b.len != 0) {
            return Err(GpuError::Shape(format!("adding {} values to {n} of {}", b.len, x.len)));
        }
        let (groups, threads_x) = self.spread(n, "an add")?;
        if b.len >= n {
            // A residual, which the norm of its sum may take in: recorded
            // later, but the inputs laid out from x are stale now.
            self.record_pending();
            self.may_write(&x.buf);
            self.pending = Some(Pending::Add { x: x.buf.clone(), b: b.buf.clone(), n });
            return Ok(());
        }
        self.dispatch(Kernel::AddInPlace, &[&x.buf, &b.buf], &[n as u32, threads_x, b.len.min(n) as u32, 0], groups);
        Ok(())
    }

    /// Copies `n` values from `src` at `src_at` to `dst` at `dst_at`.
    pub fn copy(
        &mut self,
        src: &DeviceBuffer,
        src_at: usize,
        dst: &DeviceBuffer,
        dst_at: usize,
        n: usize,
    ) -> Result<()> {
        if src_at + n > src.len || dst_at + n > dst.len {
            return Err(GpuError::Shape(format!(
                "copying {n} values from {src_at} of {} to {dst_at} of {}",
                src.len, dst.len
            )));
        }
        // A copy is recorded outside a compute pass.
        self.end_compute();
        self.may_write(&dst.buf);
        self.encoder.copy_buffer_to_buffer(&src.buf, src_at as u64 * 4, &dst.buf, dst_at as u64 * 4, n as u64 * 4);
        Ok(())
    }

    /// Rotates, in place, the first `2 * half` dimensions of each of `heads`
    /// heads (`head_dim` wide) of `rows` rows of `x`, by the angles of each
    /// row in `cos` and `sin` ([rows, half]): adjacent pairs, or halves.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &mut self,
        x: &DeviceBuffer,
        cos: &DeviceBuffer,
        sin: &DeviceBuffer,
        rows: usize,
        heads: usize,
        head_dim: usize,
        half: usize,
        halves: bool,
    ) -> Result<()> {
        if rows == 0
            || half == 0
            || 2 * half > head_dim
            || x.len < rows * heads * head_dim
            || cos.len < rows * half
            || sin.len < rows * half
        {
            return Err(GpuError::Shape(format!(
                "rope of {rows} rows of {heads} heads of {head_dim} ({half} pairs): x holds {}, the angles {} and {}",
                x.len, cos.len, sin.len
            )));
        }
        let (groups, threads_x) = self.spread(rows * heads * half, "rope")?;
        let params = [rows, heads, head_dim, half, halves as usize, threads_x as usize, 0, 0].map(|v| v as u32);
        self.dispatch(Kernel::Rope, &[&x.buf, &cos.buf, &sin.buf], &params, groups);
        Ok(())
    }

    /// Writes rows `from..from + rows` of keys and values (f32) for
    /// positions `start..start + rows` into the layer's cache, in its format.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store(
        &mut self,
        layer: &DeviceKvLayer,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        from: usize,
        rows: usize,
        start: usize,
    ) -> Result<()> {
        let end = from + rows;
        if rows == 0 || rows > layer.ring || k.len < end * layer.width_k || v.len < end * layer.width_v {
            return Err(GpuError::Shape(format!(
                "storing {rows} rows in a ring of {}: keys hold {}, values {}",
                layer.ring, k.len, v.len
            )));
        }
        let units = rows * (layer.width_k + layer.width_v) / layer.format.unit();
        let (groups, threads_x) = self.spread(units, "storing the cache")?;
        let params = [rows, layer.width_k, layer.width_v, start, layer.ring, threads_x as usize, from, 0].map(|v| v as u32);
        self.dispatch(Kernel::KvStore(layer.format), &[&k.buf, &v.buf, &layer.k, &layer.v], &params, groups);
        Ok(())
    }

    /// One sequence's rows `from..from + rows` of a pass (positions
    /// `start..`) made ready for attention in one kernel: its queries (`q`,
    /// rows of `n_head` heads) rotated in place as [`Pass::rope`] rotates
    /// them, its keys rotated and stored with its values into the layer's
    /// cache as [`Pass::rope`] and then [`Pass::kv_store`] would, bit for
    /// bit. The angles are the pass's rows'.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_and_store(
        &mut self,
        layer: &DeviceKvLayer,
        q: &DeviceBuffer,
        n_head: usize,
        k: &DeviceBuffer,
        v: &DeviceBuffer,
        cos: &DeviceBuffer,
        sin: &DeviceBuffer,
        rotation: Rotation,
        from: usize,
        rows: usize,
        start: usize,
    ) -> Result<()> {
        let Rotation { head_dim, half, halves } = rotation;
        let end = from + rows;
        if rows == 0
            || rows > layer.ring
            || half == 0
            || 2 * half > head_dim
            || layer.width_k % head_dim != 0
            || q.len < end * n_head * head_dim
            || k.len < end * layer.width_k
            || v.len < end * layer.width_v
            || cos.len < end * half
            || sin.len < end * half
        {
            return Err(GpuError::Shape(format!(
                "rotating and storing rows {from}..{end} ({rotation:?}, {n_head} query heads) in a ring of {} of keys {} and values {} wide: \
                 the queries hold {}, keys {}, values {}, angles {} and {}",
                layer.ring, layer.width_k, layer.width_v, q.len, k.len, v.len, cos.len, sin.len
            )));
        }
        let threads = rows * (n_head * half + (layer.width_k + layer.width_v) / layer.format.unit());
        let (groups, threads_x) = self.spread(threads, "rotating and storing")?;
        let n_head_kv = layer.width_k / head_dim;
        let params = [rows, from, start, layer.ring, n_head, n_head_kv, head_dim, half, halves as usize, layer.width_v, threads_x as usize, 0]
            .map(|v| v as u32);
        let buffers = [&q.buf, &k.buf, &v.buf, &cos.buf, &sin.buf, &layer.k, &layer.v];
        self.dispatch(Kernel::RopeStore(layer.format), &buffers, &params, groups);
        Ok(())
    }

    /// Attention of `s.t` query rows of `q` over the layer's cache (which
    /// must hold their positions already: `kv_store` first), into `out`
    /// ([t, n_head * head_dim_v]).
    pub fn attention(&mut self, s: &AttentionShape, q: &DeviceBuffer, layer: &DeviceKvLayer, out: &DeviceBuffer) -> Result<()> {
        self.attention_laid_out(s, q, layer, out, 1)
    }

    /// [`Pass::attention`], its output rows laid out for a product over
    /// blocks of `block` (see [`Pass::inputs_laid_out`]).
    pub fn attention_laid_out(
        &mut self,
        s: &AttentionShape,
        q: &DeviceBuffer,
        layer: &DeviceKvLayer,
        out: &DeviceBuffer,
        block: usize,
    ) -> Result<()> {
        let bad = |why: &str| Err(GpuError::Shape(format!("attention of {s:?} over a ring of {}: {why}", layer.ring)));
        if s.t == 0 || s.n_head_kv == 0 || s.n_head % s.n_head_kv != 0 {
            return bad("heads must be a whole multiple of the key-value heads");
        }
        if s.window == Some(0) {
            return bad("a window must hold a position");
        }
        if s.n_head_kv * s.head_dim_k != layer.width_k || s.n_head_kv * s.head_dim_v != layer.width_v {
            return bad("the head widths do not match the cache's rows");
        }
        if s.head_dim_v > MAX_HEAD_DIM {
            return bad("value heads are wider than the kernel holds");
        }
        if s.head_dim_k > MAX_HEAD_DIM {
            return bad("key heads are wider than the kernel holds");
        }
        // A ring must still hold every position a query sees.
        let seen = s.window.map_or(s.start + s.t, |w| (w + s.t - 1).min(s.start + s.t));
        if seen > layer.ring {
            return bad("the ring no longer holds every position the queries see");
        }
        let rows = s.row0 + s.t;
        if q.len < rows * s.n_head * s.head_dim_k || out.len < rows * s.n_head * s.head_dim_v {
            return bad("q or out is too short");
        }
        if s.n_head > self.max_groups() || s.t > self.max_groups() {
            return bad("past the dispatch limit");
        }
        let unit = layer.format.unit();
        if !s.head_dim_k.is_multiple_of(unit) || !s.head_dim_v.is_multiple_of(unit) {
            return bad(&format!("heads must be whole units of the cache's format ({unit} elements of {:?})", layer.format));
        }
        if block == 0 || (s.n_head * s.head_dim_v) % block != 0 {
            return bad("the output rows are not whole blocks of the layout");
        }
        // Blocks of 64 positions from position 0, as `attention_blocks.wgsl`
        // counts them: how many each query sees.
        let first_seen = |pos: usize| s.window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let blocks_seen = |pos: usize| pos / ATTENTION_BLOCK - first_seen(pos) / ATTENTION_BLOCK + 1;
        let most_blocks = (s.start..s.start + s.t).map(blocks_seen).max().unwrap_or(1);
        let width = s.head_dim_v + 2;
        let parts_floats = s.t * s.n_head * most_blocks * width;
        let mut pairs = AttentionPairs::of(s.n_head / s.n_head_kv, s.head_dim_k.max(s.head_dim_v));
        let head_groups = s.n_head / pairs.group as usize;
        let per_group = match self.gpu.attention_span {
            Some(span) => span / ATTENTION_BLOCK,
            None if head_groups * s.t < ATTENTION_GROUPS && most_blocks > 1 && parts_floats <= MAX_ATTENTION_PARTS => {
                (head_groups * s.t * most_blocks / ATTENTION_GROUPS).max(1)
            }
            None => most_blocks,
        };
        let splits = most_blocks.div_ceil(per_group);
        if splits > self.max_groups() {
            return bad("past the dispatch limit");
        }
        // Where each query's blocks are one workgroup's, neighbouring
        // queries share one while the call keeps ATTENTION_GROUPS.
        if splits == 1 {
            pairs = pairs.with_queries(self.gpu.attention_queries.unwrap_or(head_groups * s.t / ATTENTION_GROUPS));
        }
        let parts = self.gpu.grown(&self.gpu.attention_parts, "attention's blocks", if splits > 1 { parts_floats } else { 1 })?;
        let params = [
            s.t as u32,
            s.start as u32,
            s.n_head as u32,
            s.n_head_kv as u32,
            s.head_dim_k as u32,
            s.head_dim_v as u32,
            layer.ring as u32,
            s.window.unwrap_or(0) as u32,
            s.scale.to_bits(),
            s.row0 as u32,
            per_group as u32,
            splits as u32,
            block as u32,
            most_blocks as u32,
            0,
            0,
        ];
        self.dispatch(
            Kernel::Attention(layer.format, pairs),
            &[&q.buf, &layer.k, &layer.v, &out.buf, &parts],
            &params,
            [head_groups as u32, s.t.div_ceil(pairs.queries as usize) as u32, splits as u32],
        );
        if splits > 1 {
            let window = s.window.unwrap_or(0);
            let params = [s.n_head, s.head_dim_v, s.row0, s.start, window, most_blocks, block, 0].map(|v| v as u32);
            self.dispatch(Kernel::AttentionMerge, &[&parts, &out.buf], &params, [s.n_head as u32, s.t as u32, 1]);
        }
        Ok(())
    }

    /// The `k` largest of each of `rows` rows of `n` values of `x` (ties to
    /// the lower index), most likely first, into `out` as (index, value
    /// bits) pairs ([rows, k, 2] words): read back with
    /// [`Gpu::read_top`].
    pub fn top_k(&mut self, x: &DeviceBuffer, n: usize, rows: usize, k: usize, out: &DeviceBuffer) -> Result<()> {
        if n == 0 || k == 0 || k > n || rows == 0 || x.len < rows * n || out.len < rows * k * 2 || rows > self.max_groups() {
            return Err(GpuError::Shape(format!(
                "the top {k} of {rows} rows of {n}: x holds {}, out holds {}",
                x.len, out.len
            )));
        }
        self.dispatch(Kernel::TopK, &[&x.buf, &out.buf], &[n as u32, k as u32, rows as u32, 0], [rows as u32, 1, 1]);
        Ok(())
    }

    /// Copies `n` values of `from` at `at` into memory the host reads when
    /// the pass is submitted with [`submit_and_read`](Self::submit_and_read),
    /// as they are at this point of the pass: a later kernel may write
    /// `from` again.
    pub fn read_back(&mut self, from: &DeviceBuffer, at: usize, n: usize) -> Result<()> {
        if at + n > from.len {
            return Err(GpuError::Shape(format!("reading {n} values at {at} of a buffer of {}", from.len)));
        }
        self.read_back_bytes(&from.buf, at as u64 * 4, n as u64 * 4);
        Ok(())
    }

    /// [`read_back`](Self::read_back) of `size` bytes at byte `at`, both
    /// multiples of 4.
    fn read_back_bytes(&mut self, from: &wgpu::Buffer, at: u64, size: u64) {
        if size == 0 {
            return;
        }
        // A copy is recorded outside a compute pass.
        self.end_compute();
        let reads = &mut self.reads;
        if reads.staging.last().is_none_or(|b| b.size() - reads.filled < size) {
            // The kept buffer for a pass's first read, when it is large enough.
            let kept = if reads.staging.is_empty() { self.gpu.readback.lock().unwrap_or_else(|p| p.into_inner()).take() } else { None };
            let buf = kept.filter(|b| b.size() >= size).unwrap_or_else(|| {
                let before = reads.staging.last().map_or(0, |b| b.size());
                self.gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("read back"),
                    size: size.next_power_of_two().max(2 * before).max(1 << 16),
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            });
            reads.staging.push(buf);
            reads.filled = 0;
        }
        let last = reads.staging.len() - 1;
        self.encoder.copy_buffer_to_buffer(from, at, &reads.staging[last], reads.filled, size);
        reads.places.push((last, reads.filled, size));
        reads.filled += size;
    }

    /// Submits what was recorded; returns how many kernels that was. A
    /// fault the device reported while it was recorded or run fails here
    /// (or at the next read).
    pub fn submit(mut self) -> Result<usize> {
        debug_assert!(self.reads.places.is_empty(), "a pass that reads is submitted with submit_and_read");
        self.end_compute();
        self.gpu.submit(self.encoder)?;
        Ok(self.kernels)
    }

    /// Submits what was recorded and waits, once, for it to run: returns
    /// how many kernels that was and the values of every
    /// [`read_back`](Self::read_back), one after another in the order
    /// they were asked for.
    pub fn submit_and_read(mut self) -> Result<(usize, Vec<f32>)> {
        self.end_compute();
        let (gpu, reads, kernels) = (self.gpu, std::mem::take(&mut self.reads), self.kernels);
        gpu.submit(self.encoder)?;
        if reads.places.is_empty() {
            return Ok((kernels, Vec::new()));
        }
        let read = gpu.map_reads(&reads);
        // A buffer that failed may be left mapped, or its mapping pending:
        // the next pass that reads makes another.
        if read.is_ok() {
            let largest = reads.staging.into_iter().max_by_key(|b| b.size()).expect("a read has its buffer");
            let mut kept = gpu.readback.lock().unwrap_or_else(|p| p.into_inner());
            if kept.as_ref().is_none_or(|b| b.size() < largest.size()) {
                *kept = Some(largest);
            }
        }
        Ok((kernels, read?))
    }
}
