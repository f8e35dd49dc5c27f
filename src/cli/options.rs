//! The typed options of the CLI: every option that takes a closed set of values is a clap
//! [`ValueEnum`] (so `--help` lists the values and a bad one is refused while parsing), and the
//! tree options `generate`, `bench` and `profile` share are one flattened [`TreeArgs`].

use clap::builder::{EnumValueParser, PossibleValue, TypedValueParser};
use clap::{Args, ValueEnum};
use sparkling::decode::propose::TreePrep;
use sparkling::decode::Method;
use sparkling::model::config::{Arch, DrafterKind};
use sparkling::model::synth::StoreDtype;
use sparkling::{Error, Result};

/// clap's parser of the `ValueEnum` `E` that also ignores case and surrounding blanks
/// (`--method AR`, `--methods "ar, dflash"`), as the hand-written parsers it replaced did. A
/// value outside the set gets clap's own error (with the valid values), which [`value_error`]
/// words as the CLI's other errors.
#[derive(Clone)]
pub struct Lenient<E>(std::marker::PhantomData<E>);

/// A [`Lenient`] parser of `E`.
pub fn lenient<E>() -> Lenient<E> {
    Lenient(std::marker::PhantomData)
}

impl<E: ValueEnum + Clone + Send + Sync + 'static> TypedValueParser for Lenient<E> {
    type Value = E;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &std::ffi::OsStr) -> std::result::Result<E, clap::Error> {
        match value.to_str().and_then(|s| E::from_str(s.trim(), true).ok()) {
            Some(v) => Ok(v),
            None => EnumValueParser::<E>::new().parse_ref(cmd, arg, value),
        }
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(E::value_variants().iter().filter_map(ValueEnum::to_possible_value)))
    }
}

/// clap's error for a value outside an option's set, worded as the CLI's other input errors
/// (`--weights `q4`: expected `native`, `q8_0`, … or `auto``); `None` for any other error.
pub fn value_error(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() != clap::error::ErrorKind::InvalidValue {
        return None;
    }
    let (Some(ContextValue::String(arg)), Some(ContextValue::String(value)), Some(ContextValue::Strings(valid))) =
        (e.get(ContextKind::InvalidArg), e.get(ContextKind::InvalidValue), e.get(ContextKind::ValidValue))
    else {
        return None;
    };
    // clap names the argument with its value placeholder: `--kv-cache <KV_CACHE>`.
    let flag = arg.split(' ').next().unwrap_or(arg);
    let valid: Vec<String> = valid.iter().map(|v| format!("`{v}`")).collect();
    let list = match valid.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        _ => valid.join(""),
    };
    Some(format!("{flag} `{value}`: expected {list}"))
}

/// `--method` / `--methods`: the decoding method ([`Method`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MethodArg {
    /// Plain autoregressive decoding (one target forward per token).
    #[value(name = "ar")]
    Ar,
    /// DFlash chain: in-place drafter, argmax per depth.
    #[value(name = "dflash")]
    DFlash,
    /// DDTree: in-place drafter, best-first tree over factorized marginals.
    #[value(name = "ddtree")]
    DDTree,
    /// DSpark chain: shifted drafter + Markov head, greedy sequential drafts.
    #[value(name = "dspark")]
    DSpark,
    /// SparklingTree: shifted drafter + Markov-conditioned best-first tree.
    #[value(name = "sparkling")]
    Sparkling,
    /// TreeSpark: per-parent top-k, frontier pruning, global top-N packing.
    #[value(name = "treespark")]
    TreeSpark,
    /// Prompt lookup, no drafter: each round proposes the tokens that followed the most recent
    /// earlier occurrence of the last 3, 2 or 1 tokens of prompt + answer.
    #[value(name = "lookup")]
    Lookup,
}

impl From<MethodArg> for Method {
    fn from(m: MethodArg) -> Method {
        match m {
            MethodArg::Ar => Method::Ar,
            MethodArg::DFlash => Method::DFlash,
            MethodArg::DDTree => Method::DDTree,
            MethodArg::DSpark => Method::DSpark,
            MethodArg::Sparkling => Method::Sparkling,
            MethodArg::TreeSpark => Method::TreeSpark,
            MethodArg::Lookup => Method::Lookup,
        }
    }
}

/// `--backend`: where the model runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// The CPU (SIMD kernels, rayon threads).
    #[value(name = "cpu")]
    Cpu,
    /// Vulkan / Metal / DX12 / GL through wgpu (a build with `--features wgpu`).
    #[value(name = "wgpu")]
    Wgpu,
    /// NVIDIA GPUs (a build with `--features cuda`, the driver, libnvrtc and libcublas).
    #[value(name = "cuda")]
    Cuda,
}

impl BackendKind {
    /// The `--backend` spelling.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Wgpu => "wgpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

/// `--weights`: how the target's weights are stored on the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WeightsArg {
    /// GGUF tensors as stored (cpu: quantized blocks on int8 kernels; wgpu: Q8_0 / Q4_0 / Q4_1 /
    /// Q5_0 / Q4_K / Q6_K blocks dequantized in registers, other types f16).
    #[value(name = "native")]
    Native,
    /// Float matrices quantized to Q8_0 at load (cpu).
    #[value(name = "q8_0")]
    Q8_0,
    /// 4 bytes a weight.
    #[value(name = "f32")]
    F32,
    /// 2 bytes a weight.
    #[value(name = "f16")]
    F16,
    /// 2 bytes a weight (wgpu, cuda).
    #[value(name = "bf16")]
    Bf16,
    /// native for GGUF targets on the cpu and wgpu (bf16 on cuda), f32 otherwise.
    #[value(name = "auto")]
    Auto,
}

impl WeightsArg {
    /// The `--weights` spelling (also a part of the cost-cache key).
    pub fn name(self) -> &'static str {
        match self {
            WeightsArg::Native => "native",
            WeightsArg::Q8_0 => "q8_0",
            WeightsArg::F32 => "f32",
            WeightsArg::F16 => "f16",
            WeightsArg::Bf16 => "bf16",
            WeightsArg::Auto => "auto",
        }
    }
}

/// `--kv-cache`: how the KV cache is stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum KvCacheArg {
    /// f16 on the cpu, f32 on wgpu and cuda.
    #[value(name = "auto")]
    Auto,
    /// Half precision (cpu).
    #[value(name = "f16")]
    F16,
    /// llama.cpp's q8_0 blocks (cpu).
    #[value(name = "q8_0")]
    Q8_0,
    /// Single precision.
    #[value(name = "f32")]
    F32,
}

impl KvCacheArg {
    /// The `--kv-cache` spelling.
    pub fn name(self) -> &'static str {
        match self {
            KvCacheArg::Auto => "auto",
            KvCacheArg::F16 => "f16",
            KvCacheArg::Q8_0 => "q8_0",
            KvCacheArg::F32 => "f32",
        }
    }
}

/// `--tree-prep`: where draft candidates are selected ([`TreePrep`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TreePrepArg {
    /// host on the cpu backend, device otherwise.
    #[value(name = "auto")]
    Auto,
    /// Download the draft logits and select on the host.
    #[value(name = "host")]
    Host,
    /// Select on the backend; only the selection comes back.
    #[value(name = "device")]
    Device,
}

impl From<TreePrepArg> for TreePrep {
    fn from(p: TreePrepArg) -> TreePrep {
        match p {
            TreePrepArg::Auto => TreePrep::Auto,
            TreePrepArg::Host => TreePrep::Host,
            TreePrepArg::Device => TreePrep::Device,
        }
    }
}

/// `--lookup-drafter`: whether the drafter runs in a round with a matched lookup chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum LookupDrafterArg {
    /// A round with a match verifies the chain alone; the drafter runs in the other rounds.
    #[value(name = "fallback")]
    Fallback,
    /// The drafter's tree and the chain every round.
    #[value(name = "always")]
    Always,
}

impl LookupDrafterArg {
    /// The `--lookup-drafter` spelling.
    pub fn name(self) -> &'static str {
        match self {
            LookupDrafterArg::Fallback => "fallback",
            LookupDrafterArg::Always => "always",
        }
    }
}

/// `init-drafter --kind`: the drafter convention ([`DrafterKind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DrafterKindArg {
    /// In-place slots, borrows the target's embedding and lm_head.
    #[value(name = "dflash")]
    DFlash,
    /// Shifted slots, Markov head.
    #[value(name = "dspark")]
    DSpark,
}

impl From<DrafterKindArg> for DrafterKind {
    fn from(k: DrafterKindArg) -> DrafterKind {
        match k {
            DrafterKindArg::DFlash => DrafterKind::DFlash,
            DrafterKindArg::DSpark => DrafterKind::DSpark,
        }
    }
}

/// `synth-target --arch`: the decoder family ([`Arch`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ArchArg {
    /// Llama.
    #[value(name = "llama")]
    Llama,
    /// Qwen2 (q/k/v biases).
    #[value(name = "qwen2")]
    Qwen2,
    /// Qwen3 (per-head q/k norms).
    #[value(name = "qwen3")]
    Qwen3,
}

impl From<ArchArg> for Arch {
    fn from(a: ArchArg) -> Arch {
        match a {
            ArchArg::Llama => Arch::Llama,
            ArchArg::Qwen2 => Arch::Qwen2,
            ArchArg::Qwen3 => Arch::Qwen3,
        }
    }
}

/// `synth --preset`: a real geometry (the names of [`sparkling::model::synth::PRESETS`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PresetArg {
    /// Qwen3-4B.
    #[value(name = "qwen3-4b")]
    Qwen3_4b,
    /// Qwen3-8B.
    #[value(name = "qwen3-8b")]
    Qwen3_8b,
    /// SmolLM2-135M.
    #[value(name = "smollm2-135m")]
    Smollm2_135m,
}

impl PresetArg {
    /// The preset's name in [`sparkling::model::synth::PRESETS`].
    pub fn name(self) -> &'static str {
        match self {
            PresetArg::Qwen3_4b => "qwen3-4b",
            PresetArg::Qwen3_8b => "qwen3-8b",
            PresetArg::Smollm2_135m => "smollm2-135m",
        }
    }
}

/// `reduce-vocab --dtype`: tensor storage of a written checkpoint ([`StoreDtype`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DtypeArg {
    /// bfloat16.
    #[value(name = "bf16")]
    Bf16,
    /// float32.
    #[value(name = "f32")]
    F32,
}

impl From<DtypeArg> for StoreDtype {
    fn from(d: DtypeArg) -> StoreDtype {
        match d {
            DtypeArg::Bf16 => StoreDtype::Bf16,
            DtypeArg::F32 => StoreDtype::F32,
        }
    }
}

/// The tree and drafter options of `generate`, `bench` and `profile` (their budgets differ:
/// `generate --budget`, `bench --budgets`, `profile --budget`).
#[derive(Args, Debug, Clone, Default)]
pub struct TreeArgs {
    /// No effect, kept so that earlier command lines run: `--budget auto` no longer weighs its
    /// predictions by the drafter's DSpark confidence head (measured neutral, BENCHMARKS §26 c),
    /// so it always predicts from the calibrated path probabilities. Accepted where it was
    /// (DSpark-drafter methods under `--budget auto`), with a note.
    #[arg(long, hide = true)]
    pub no_confidence: bool,
    /// SparklingTree candidates (sparkling only; default 128): top-C tokens per depth in the
    /// union table (C ≥ vocabulary takes every token; the device table costs O(n²) in the union
    /// size n ≈ depth·C).
    #[arg(long, allow_negative_numbers = true)]
    pub candidates: Option<usize>,
    /// SparklingTree maximum children per parent (sparkling only; default 64).
    #[arg(long, allow_negative_numbers = true)]
    pub max_fanout: Option<usize>,
    /// TreeSpark children per parent, k (treespark only; default 4).
    #[arg(long, allow_negative_numbers = true)]
    pub treespark_k: Option<usize>,
    /// Where draft candidates are selected (methods with a drafter; default auto).
    #[arg(long, value_parser = lenient::<TreePrepArg>())]
    pub tree_prep: Option<TreePrepArg>,
    /// Prompt lookup beside the drafter (methods with a drafter): each round the tokens that
    /// followed the most recent earlier occurrence of the context's last 3, 2 or 1 tokens are
    /// grafted onto the drafter's tree as a chain, and the target verifies both at once.
    /// With k = min(N, 6) (3 when sampling, T > 0): ⌈k·n/3⌉ tokens follow an n-token match
    /// (n = 1, 2), and a 3-token match gets k tokens, or as many as the match's whole length if
    /// longer, up to N.
    /// `auto` (default): sparkling chains of up to 16 tokens on the cpu, 8 elsewhere; the
    /// published methods (dflash, ddtree, dspark, treespark) none. `off` (or 0), or N: chains
    /// of up to N tokens (at most 64) for any method with a drafter. `bench` takes a
    /// comma-separated list and runs each method with a drafter at every value (`--lookup
    /// auto,off` measures the graft against the drafter alone in one interleaved run).
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true)]
    pub lookup: Option<Vec<String>>,
    /// With a lookup chain: `fallback` (the default on the cpu, where the drafter's forward and
    /// its extra verify rows rarely pay beside a matched chain) or `always` (the default
    /// elsewhere).
    #[arg(long, value_parser = lenient::<LookupDrafterArg>())]
    pub lookup_drafter: Option<LookupDrafterArg>,
}

impl TreeArgs {
    /// The note `--no-confidence` gets (it has no effect).
    pub fn note_no_confidence(&self) {
        if self.no_confidence {
            eprintln!("note: --no-confidence has no effect: --budget auto no longer reads the drafter's confidence head (it did not pay, BENCHMARKS §26 c)");
        }
    }

    /// The options [`super::refuse_unused_options`] checks, with whether each was given;
    /// `budget` names the command's budget option (`--budget`, bench's `--budgets`) and
    /// `drafter` says whether `--drafter` was given.
    pub fn given<'a>(&self, budget: &'a str, budget_given: bool, drafter: bool) -> [(&'a str, bool); 9] {
        [
            (budget, budget_given),
            ("--no-confidence", self.no_confidence),
            ("--candidates", self.candidates.is_some()),
            ("--max-fanout", self.max_fanout.is_some()),
            ("--treespark-k", self.treespark_k.is_some()),
            ("--tree-prep", self.tree_prep.is_some()),
            ("--drafter", drafter),
            ("--lookup", self.lookup.is_some()),
            ("--lookup-drafter", self.lookup_drafter.is_some()),
        ]
    }

    /// The one `--lookup` value of a command that runs one configuration (`generate`,
    /// `profile`). Errors: a list.
    pub fn one_lookup(&self) -> Result<Option<&str>> {
        match self.lookup.as_deref() {
            None => Ok(None),
            Some([one]) => Ok(Some(one.as_str())),
            Some(list) => Err(Error::Input(format!("--lookup {}: one value here (a comma-separated list is for `bench`)", list.join(",")))),
        }
    }

    /// Refuse zero counts, naming the option (before the library's own check names its
    /// parameter).
    pub fn check_counts(&self) -> Result<()> {
        for (v, arg) in [(self.candidates, "--candidates"), (self.max_fanout, "--max-fanout"), (self.treespark_k, "--treespark-k")] {
            if v == Some(0) {
                return Err(Error::Input(format!("{arg} 0: must be ≥ 1")));
            }
        }
        Ok(())
    }
}
