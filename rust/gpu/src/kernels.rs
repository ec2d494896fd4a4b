//! The WGSL kernels: each one's source, assembled from shared parts, and the
//! pipelines built from them on first use.

use std::collections::HashMap;
use std::sync::Mutex;

use ember_gguf::GgmlType;

use crate::{Activation, KvFormat};

/// The matrix product's template and, per weight format, the file that
/// gives its block (elements, bytes, and the dot of one block with the input).
const MATMUL: &str = include_str!("shaders/matmul.wgsl");
const MATMUL_ID: &str = include_str!("shaders/matmul_id.wgsl");
const MATMUL_GATED: &str = include_str!("shaders/matmul_gated.wgsl");
const MATMUL_SPLIT: &str = include_str!("shaders/matmul_split.wgsl");
const MATMUL_ROWS: &str = include_str!("shaders/matmul_rows.wgsl");
const MATMUL_TILES: &str = include_str!("shaders/matmul_tiles.wgsl");
const ACTIVATIONS: &str = include_str!("shaders/activations.wgsl");
const MATMUL_COMMON: &str = include_str!("shaders/matmul_common.wgsl");
const K_SCALES: &str = include_str!("shaders/formats/k_scales.wgsl");
const IQ4_LEVELS: &str = include_str!("shaders/formats/iq4_levels.wgsl");
const RMS_NORM: &str = include_str!("shaders/rms_norm.wgsl");

/// The norm's forms (see `rms_norm.wgsl`): its input as it is, or with a
/// residual added first; its output as it is, or laid out as well.
const NORM_INPUT: &str = "@group(0) @binding(0) var<storage, read> x: array<f32>;
fn load(at: u32) -> f32 {
    return x[at];
}";
const NORM_INPUT_ADDED: &str = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(3) var<storage, read> b: array<f32>;
fn load(at: u32) -> f32 {
    let v = x[at] + b[at];
    x[at] = v;
    return v;
}";
const NORM_OUTPUT: &str = "fn store(start: u32, i: u32, v: f32) {
    out[start + i] = v;
}";
const NORM_OUTPUT_LAID_OUT: &str = "@group(0) @binding(LAID_OUT) var<storage, read_write> laid_out: array<f32>;
fn store(start: u32, i: u32, v: f32) {
    out[start + i] = v;
    laid_out[start + laid_out_at(i, p.width, p.block)] = v;
}";
const WORKGROUP_SUM: &str = include_str!("shaders/workgroup_sum.wgsl");
const ELEMENTWISE: &str = include_str!("shaders/elementwise.wgsl");
const ADD_IN_PLACE: &str = include_str!("shaders/add_in_place.wgsl");
const SCALE: &str = include_str!("shaders/scale.wgsl");
const ROPE: &str = include_str!("shaders/rope.wgsl");
const ROPE_STORE: &str = include_str!("shaders/rope_store.wgsl");
const ROTATE: &str = include_str!("shaders/rotate.wgsl");
const KV_STORE: &str = include_str!("shaders/kv_store.wgsl");
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
const ATTENTION_MERGE: &str = include_str!("shaders/attention_merge.wgsl");
const ATTENTION_BLOCKS: &str = include_str!("shaders/attention_blocks.wgsl");
const LAID_OUT: &str = include_str!("shaders/laid_out.wgsl");
const MOE_ROUTE: &str = include_str!("shaders/moe_route.wgsl");
const MOE_COMBINE: &str = include_str!("shaders/moe_combine.wgsl");
const TOP_K: &str = include_str!("shaders/top_k.wgsl");
const DELTA_GATES: &str = include_str!("shaders/delta_gates.wgsl");
const DELTA_CONV: &str = include_str!("shaders/delta_conv.wgsl");
const DELTA_RULE: &str = include_str!("shaders/delta_rule.wgsl");
const L2_NORM: &str = include_str!("shaders/l2_norm.wgsl");
const SPLIT_GATES: &str = include_str!("shaders/split_gates.wgsl");
const ROW_GATE: &str = include_str!("shaders/row_gate.wgsl");
const BLOCK_INPUTS: &str = include_str!("shaders/block_inputs.wgsl");

/// The shared part's line that sets how many inputs a thread takes.
const WIDE_COLS: &str = "const COLS: u32 = 8u;";

/// The products' forms of R rows a thread (see `matmul_common.wgsl`).
const ONE_ROW: &str = include_str!("shaders/one_row.wgsl");
const FOUR_ROWS: &str = include_str!("shaders/four_rows.wgsl");

/// An invocation's place in its workgroup, without subgroups and with them.
/// WGSL's `enable subgroups;` is not asked for where they are used: naga
/// takes subgroup operations where the device has the feature, and refuses
/// the directive.
const INVOCATION: &str = include_str!("shaders/invocation.wgsl");
const INVOCATION_IN_SUBGROUPS: &str = include_str!("shaders/invocation_subgroups.wgsl");

fn invocation(subgroups: Subgroups) -> &'static str {
    match subgroups.smallest {
        Some(_) => INVOCATION_IN_SUBGROUPS,
        None => INVOCATION,
    }
}

/// What a kernel that adds its threads' values by a tree (`workgroup_sum.wgsl`)
/// takes from the device: an invocation's place, the distance below which
/// pairs share a subgroup (SHUFFLED_BELOW: 1 without subgroups, and at most
/// the `threads` a tree adds, whose pairs are never further apart), and
/// `add_across`, a pair's sum for values of type `ty` by a shuffle.
fn tree_steps(subgroups: Subgroups, ty: &str, threads: u32) -> String {
    let steps = match subgroups.smallest {
        Some(smallest) => format!(
            "const SHUFFLED_BELOW: u32 = {}u;
fn add_across(v: {ty}, s: u32) -> {ty} {{
    return v + subgroupShuffleXor(v, s);
}}",
            smallest.min(threads)
        ),
        // Never called: every step is in workgroup memory.
        None => format!(
            "const SHUFFLED_BELOW: u32 = 1u;
fn add_across(v: {ty}, s: u32) -> {ty} {{
    return v;
}}"
        ),
    };
    format!("{}\n{steps}", invocation(subgroups))
}

/// How a cache's format is written (a unit a thread) and read.
const KV_ROWS: &str = include_str!("shaders/kv_rows.wgsl");
const KV_WRITE_F16: &str = include_str!("shaders/kv_write_f16.wgsl");
const KV_WRITE_Q8_0: &str = include_str!("shaders/kv_write_q8_0.wgsl");
const KV_READ_F16: &str = include_str!("shaders/kv_read_f16.wgsl");
const KV_READ_Q8_0: &str = include_str!("shaders/kv_read_q8_0.wgsl");

/// The storing of a pass's rows in a cache of `format`.
fn kv_writes(format: KvFormat) -> String {
    let unit = match format {
        KvFormat::F16 => KV_WRITE_F16,
        KvFormat::Q8_0 => KV_WRITE_Q8_0,
    };
    format!("{KV_ROWS}\n{unit}")
}

/// An attention block's maximum, without subgroups and with them.
const BLOCK_MAX: &str = include_str!("shaders/block_max.wgsl");
const BLOCK_MAX_SUBGROUPS: &str = include_str!("shaders/block_max_subgroups.wgsl");

/// The IQ4 levels of R indices, in each form.
const ONE_ROW_LEVELS: &str = "fn iq4_level(i: Ru) -> Rf {
    return iq4_level1(i);
}";
const FOUR_ROWS_LEVELS: &str = "fn iq4_level(i: Ru) -> Rf {
    return Rf(iq4_level1(i.x), iq4_level1(i.y), iq4_level1(i.z), iq4_level1(i.w));
}";

/// How a product shares out its work: the row-parallel form, with the
/// inputs a thread takes (eight where `wide`, else one) and its rows (four,
/// or one); or the tiled form (`tiles`: four rows and eight inputs a
/// thread, a workgroup a tile of them). Every form adds each row's terms in
/// the same order (`matmul_common.wgsl`), so the choice is the speed's alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Shareout {
    pub(crate) wide: bool,
    pub(crate) four_rows: bool,
    pub(crate) tiles: bool,
}

/// Workgroups a decoded token's product of four rows a thread must still
/// have to be given them: fewer would leave a large card's compute units
/// idle, where one row a thread keeps them busy.
const FOUR_ROWS_MIN_GROUPS: usize = 256;

/// Inputs from which a product of a block format is tiled: below, the
/// row-parallel form shares a few inputs' rows out over more threads. The
/// formats of one element a block (F32, F16, BF16) are never tiled: a tile
/// would stage one element a step.
const TILES_MIN_INPUTS: usize = 16;

impl Shareout {
    /// The form of a product of `rows` rows of `ty` over `n` inputs: tiles
    /// for a prompt (where `tiles`), four rows a thread for a few inputs,
    /// each input read once for all four, and for a decoded token where its
    /// workgroups still fill a card.
    pub(crate) fn of(n: usize, rows: usize, ty: GgmlType, tiles: bool) -> Shareout {
        if tiles && n >= TILES_MIN_INPUTS && ty.block_size() > 1 {
            return Shareout { wide: true, four_rows: true, tiles: true };
        }
        let wide = n > 1;
        let four = Shareout { wide, four_rows: true, tiles: false };
        let four_rows = wide || rows.div_ceil(four.rows_a_group(ty)) >= FOUR_ROWS_MIN_GROUPS;
        Shareout { four_rows, ..four }
    }

    pub(crate) fn rows_a_thread(self) -> usize {
        if self.four_rows {
            4
        } else {
            1
        }
    }

    /// Groups of COLS inputs a tiled workgroup of `ty` takes: as many as
    /// stage a block of each input in STAGED_FLOATS, up to four (a tile of
    /// 64 rows by 32 inputs for the 32-element formats, 256 by 8 for the
    /// others).
    pub(crate) fn tile_col_groups(ty: GgmlType) -> usize {
        (STAGED_FLOATS / (COLS * ty.block_size())).clamp(1, 4)
    }

    /// Rows a workgroup of 64 threads takes.
    pub(crate) fn rows_a_group(self, ty: GgmlType) -> usize {
        let groups = match self.tiles {
            true => WG as usize / Self::tile_col_groups(ty),
            false => WG as usize / STRANDS,
        };
        groups * self.rows_a_thread()
    }

    /// Inputs a workgroup takes.
    pub(crate) fn inputs_a_group(self, ty: GgmlType) -> usize {
        match (self.tiles, self.wide) {
            (true, _) => COLS * Self::tile_col_groups(ty),
            (false, true) => COLS,
            (false, false) => 1,
        }
    }

    /// The block its inputs are read laid out in (`block_inputs.wgsl`): the
    /// format's for the row-parallel form, whose neighbouring threads read
    /// neighbouring blocks; none (rows as they are) for the tiled form,
    /// which stages a block of each input from a run of floats.
    pub(crate) fn inputs_block(self, ty: GgmlType) -> usize {
        match self.tiles {
            true => 1,
            false => ty.block_size(),
        }
    }
}

/// How many of a key-value head's query heads an attention workgroup takes
/// (`group`), and how many neighbouring queries (`queries`), each key and
/// value element read once for all those (query, head) pairs; and the value
/// elements each of its 64 threads holds a pair (`per_thread`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct AttentionPairs {
    pub(crate) group: u32,
    pub(crate) queries: u32,
    pub(crate) per_thread: u32,
}

/// The most sums a thread of attention holds for its pairs' value elements
/// (PAIRS * PER_THREAD, and as many for a block's): more pairs in a
/// workgroup would hold more registers than a card's thread keeps busy.
const ATTENTION_SUMS: usize = 16;

impl AttentionPairs {
    /// The form for heads `width` wide (the wider of the keys and values:
    /// the staged queries take `per_thread * 64` floats a pair),
    /// `heads_per_kv` of them to a key-value head: as many of them as
    /// divide it and keep ATTENTION_SUMS, and one query a workgroup.
    pub(crate) fn of(heads_per_kv: usize, width: usize) -> AttentionPairs {
        let per_thread = width.div_ceil(WG as usize).max(1);
        let group = (1..=heads_per_kv).rev().find(|g| heads_per_kv % g == 0 && g * per_thread <= ATTENTION_SUMS).unwrap_or(1);
        AttentionPairs { group: group as u32, queries: 1, per_thread: per_thread as u32 }
    }

    /// With up to `queries` queries a workgroup, as many as keep
    /// ATTENTION_SUMS.
    pub(crate) fn with_queries(self, queries: usize) -> AttentionPairs {
        let most = ATTENTION_SUMS / (self.group * self.per_thread) as usize;
        AttentionPairs { queries: queries.clamp(1, most.max(1)) as u32, ..self }
    }
}

/// Threads a workgroup of the kernels holds (their `WG`).
const WG: u32 = 64;

/// Strands a row's pieces are dealt out to (`matmul_common.wgsl`'s STRANDS):
/// the row-parallel form's threads a row.
const STRANDS: usize = 32;

/// Inputs a thread of a wide product takes (`matmul_common.wgsl`'s COLS).
const COLS: usize = 8;

/// Floats a tiled workgroup stages its inputs' blocks in: 8 KiB (and a
/// float a column), which with the gated product's hand-over of 4 KiB
/// stays within the 16 KiB of workgroup memory every device gives.
const STAGED_FLOATS: usize = 2048;

fn format_source(ty: GgmlType) -> Option<&'static str> {
    use GgmlType::*;
    Some(match ty {
        F32 => include_str!("shaders/formats/f32.wgsl"),
        F16 => include_str!("shaders/formats/f16.wgsl"),
        BF16 => include_str!("shaders/formats/bf16.wgsl"),
        Q4_0 => include_str!("shaders/formats/q4_0.wgsl"),
        Q4_1 => include_str!("shaders/formats/q4_1.wgsl"),
        Q5_0 => include_str!("shaders/formats/q5_0.wgsl"),
        Q5_1 => include_str!("shaders/formats/q5_1.wgsl"),
        Q8_0 => include_str!("shaders/formats/q8_0.wgsl"),
        Q2_K => include_str!("shaders/formats/q2_k.wgsl"),
        Q3_K => include_str!("shaders/formats/q3_k.wgsl"),
        IQ4_NL => include_str!("shaders/formats/iq4_nl.wgsl"),
        IQ4_XS => include_str!("shaders/formats/iq4_xs.wgsl"),
        Q4_K => include_str!("shaders/formats/q4_k.wgsl"),
        Q5_K => include_str!("shaders/formats/q5_k.wgsl"),
        Q6_K => include_str!("shaders/formats/q6_k.wgsl"),
        _ => return None,
    })
}

/// Whether the device has a matrix product for weights of this type.
pub fn matmul_supports(ty: GgmlType) -> bool {
    format_source(ty).is_some()
}

/// A kernel, as the pipeline cache names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Kernel {
    /// The weight type, and the inputs and rows a thread takes: eight
    /// inputs for a prompt, one for a decoded token (where eight would cost
    /// it the unused columns).
    Matmul(GgmlType, Shareout),
    /// A gated feed-forward's two products and its activation (shared out
    /// as `Matmul`'s).
    MatmulGated(GgmlType, Shareout, Activation),
    /// Three products over the same inputs, each to its own output.
    MatmulSplit(GgmlType, Shareout),
    /// A mixture's expert products, one input a thread.
    MatmulId(GgmlType),
    /// RMS norm: whether a residual add comes first (its buffer bound
    /// after the output), and whether the output is laid out block-major as
    /// well (bound last).
    RmsNorm { added: bool, laid_out: bool },
    SiluMul,
    GeluMul,
    SigmoidMul,
    AddInPlace,
    Scale,
    Rope,
    /// Keys and values stored in a cache of this format.
    KvStore(KvFormat),
    /// A sequence's queries rotated, its keys rotated and stored, its values
    /// stored, in a cache of this format.
    RopeStore(KvFormat),
    /// Attention over a cache of this format, a workgroup taking the
    /// queries, heads and value elements a thread that `AttentionPairs` gives.
    Attention(KvFormat, AttentionPairs),
    AttentionMerge,
    MoeRoute,
    MoeCombine,
    TopK,
    DeltaGates,
    DeltaConv,
    DeltaRule,
    L2Norm,
    SplitGates,
    RowGate,
    BlockInputs,
}

impl Kernel {
    fn entry_point(self) -> &'static str {
        match self {
            Kernel::SiluMul => "silu_mul",
            Kernel::GeluMul => "gelu_mul",
            Kernel::SigmoidMul => "sigmoid_mul",
            _ => "main",
        }
    }

    fn source(self, subgroups: Subgroups) -> Option<String> {
        Some(match self {
            Kernel::Matmul(ty, form) => row_product(MATMUL, ty, form, subgroups)?,
            Kernel::MatmulSplit(ty, form) => row_product(MATMUL_SPLIT, ty, form, subgroups)?,
            Kernel::MatmulId(ty) => product(MATMUL_ID, ty, Shareout { wide: false, four_rows: false, tiles: false })?,
            Kernel::MatmulGated(ty, form, act) => {
                let which = match act {
                    Activation::Silu => "silu_mul_of",
                    Activation::GeluTanh => "gelu_mul_of",
                    Activation::Sigmoid => "sigmoid_mul_of",
                };
                let chosen = format!("fn activation(g: f32, u: f32) -> f32 {{\n    return {which}(g, u);\n}}");
                format!("{}\n{ACTIVATIONS}\n{LAID_OUT}\n{chosen}", row_product(MATMUL_GATED, ty, form, subgroups)?)
            }
            Kernel::RmsNorm { added, laid_out } => {
                let input = if added { NORM_INPUT_ADDED } else { NORM_INPUT };
                let output = match laid_out {
                    true => format!("{}\n{LAID_OUT}", NORM_OUTPUT_LAID_OUT.replace("LAID_OUT", if added { "4" } else { "3" })),
                    false => NORM_OUTPUT.to_string(),
                };
                format!("{RMS_NORM}\n{WORKGROUP_SUM}\n{}\n{input}\n{output}", tree_steps(subgroups, "f32", WG))
            }
            Kernel::SiluMul | Kernel::GeluMul | Kernel::SigmoidMul => format!("{ELEMENTWISE}\n{ACTIVATIONS}"),
            Kernel::AddInPlace => ADD_IN_PLACE.to_string(),
            Kernel::Scale => SCALE.to_string(),
            Kernel::Rope => format!("{ROPE}\n{ROTATE}"),
            Kernel::RopeStore(format) => format!("{ROPE_STORE}\n{ROTATE}\n{}", kv_writes(format)),
            Kernel::KvStore(format) => format!("{KV_STORE}\n{}", kv_writes(format)),
            Kernel::Attention(format, pairs) => {
                let block_max = match subgroups.smallest {
                    Some(_) => BLOCK_MAX_SUBGROUPS,
                    None => BLOCK_MAX,
                };
                let reads = match format {
                    KvFormat::F16 => KV_READ_F16,
                    KvFormat::Q8_0 => KV_READ_Q8_0,
                };
                let sizes = format!(
                    "const GROUP: u32 = {}u;\nconst QUERIES: u32 = {}u;\nconst PER_THREAD: u32 = {}u;",
                    pairs.group, pairs.queries, pairs.per_thread
                );
                format!("{ATTENTION}\n{ATTENTION_BLOCKS}\n{LAID_OUT}\n{}\n{block_max}\n{reads}\n{sizes}", invocation(subgroups))
            }
            Kernel::AttentionMerge => format!("{ATTENTION_MERGE}\n{ATTENTION_BLOCKS}\n{LAID_OUT}"),
            Kernel::MoeRoute => MOE_ROUTE.to_string(),
            Kernel::MoeCombine => MOE_COMBINE.to_string(),
            Kernel::TopK => TOP_K.to_string(),
            Kernel::DeltaGates => DELTA_GATES.to_string(),
            Kernel::DeltaConv => DELTA_CONV.to_string(),
            Kernel::DeltaRule => DELTA_RULE.to_string(),
            Kernel::L2Norm => format!("{L2_NORM}\n{WORKGROUP_SUM}\n{}", tree_steps(subgroups, "f32", WG)),
            Kernel::SplitGates => SPLIT_GATES.to_string(),
            Kernel::RowGate => ROW_GATE.to_string(),
            Kernel::BlockInputs => format!("{BLOCK_INPUTS}\n{LAID_OUT}"),
        })
    }
}

/// A product's source: its entry point and buffers (`main`), the shared
/// readers with the inputs and the form of the rows a thread takes, and
/// the format's block; WGSL declarations may come in any order.
fn product(main: &str, ty: GgmlType, form: Shareout) -> Option<String> {
    let block = format_source(ty)?;
    let (rows, levels) = match form.four_rows {
        false => (ONE_ROW, ONE_ROW_LEVELS),
        true => (FOUR_ROWS, FOUR_ROWS_LEVELS),
    };
    let scales = match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => K_SCALES.to_string(),
        GgmlType::IQ4_NL | GgmlType::IQ4_XS => format!("{IQ4_LEVELS}\n{levels}"),
        _ => String::new(),
    };
    let common = match form.wide {
        true => MATMUL_COMMON.to_string(),
        false => MATMUL_COMMON.replace(WIDE_COLS, "const COLS: u32 = 1u;"),
    };
    let apart = format!("const SCALE_APART: u32 = {}u;", crate::layout::scale_bytes_apart(ty));
    Some(format!("{main}\n{common}\n{rows}\n{scales}\n{block}\n{apart}"))
}

/// A product's source in one of its shared-out forms (`matmul_rows.wgsl` or
/// `matmul_tiles.wgsl` under `main`).
fn row_product(main: &str, ty: GgmlType, form: Shareout, subgroups: Subgroups) -> Option<String> {
    let shared_out = match form.tiles {
        true => format!("{MATMUL_TILES}\nconst COL_GROUPS: u32 = {}u;", Shareout::tile_col_groups(ty)),
        false => MATMUL_ROWS.to_string(),
    };
    product(&format!("{main}\n{shared_out}\n{}", invocation(subgroups)), ty, form)
}

/// Whether the kernels use subgroup operations, and the fewest invocations
/// a subgroup of this device holds (None: it has none, or they are not
/// to be used).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Subgroups {
    pub(crate) smallest: Option<u32>,
}

impl Subgroups {
    /// What a device offering `features`, with subgroups of `min_size` and
    /// up, lets the kernels use. A size that is not a power of two (none
    /// the Vulkan spec allows) is not used: the tree's steps halve.
    pub(crate) fn of(features: wgpu::Features, min_size: u32) -> Subgroups {
        let usable = features.contains(wgpu::Features::SUBGROUP) && min_size >= 2 && min_size.is_power_of_two();
        Subgroups { smallest: usable.then_some(min_size) }
    }
}

/// Pipelines built once per device and kernel.
pub(crate) struct Pipelines {
    built: Mutex<HashMap<Kernel, wgpu::ComputePipeline>>,
    subgroups: Subgroups,
}

impl Pipelines {
    pub(crate) fn new(subgroups: Subgroups) -> Pipelines {
        Pipelines { built: Mutex::default(), subgroups }
    }

    pub(crate) fn subgroups(&self) -> Subgroups {
        self.subgroups
    }

    /// The kernel's pipeline, building it on first use; None for a kernel
    /// that has no source (a weight type without a device kernel).
    pub(crate) fn get(&self, device: &wgpu::Device, kernel: Kernel) -> Option<wgpu::ComputePipeline> {
        let mut built = self.built.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = built.get(&kernel) {
            return Some(p.clone());
        }
        let source = kernel.source(self.subgroups)?;
        let label = format!("{kernel:?}");
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(&label),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(&label),
            layout: None,
            module: &module,
            entry_point: Some(kernel.entry_point()),
            compilation_options: Default::default(),
            cache: None,
        });
        built.insert(kernel, pipeline.clone());
        Some(pipeline)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_matmul_template_sets_its_width_where_the_narrow_form_replaces_it() {
        assert!(super::MATMUL_COMMON.contains(super::WIDE_COLS));
        assert!(super::WIDE_COLS.contains(&format!("{}u", super::COLS)));
        assert!(super::MATMUL_COMMON.contains(&format!("const STRANDS: u32 = {}u;", super::STRANDS)));
    }
}
