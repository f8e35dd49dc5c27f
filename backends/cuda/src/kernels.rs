//! The CUDA C kernel sources (`shaders/cuda/`, one op per file, included with `include_str!`)
//! and their run-time compilation by NVRTC.
//!
//! The backend compiles one program — `prelude.cuh` + `block_topk.cuh` + every op file — once
//! per process and device architecture ([`compile`] results are cached), to a CUBIN for the
//! device's own `sm_XY` when this NVRTC knows it, else to PTX for the newest architecture it
//! knows below the device (the driver JIT-compiles that PTX). NVRTC is a compiler library that
//! needs no GPU, so CI compiles every source here too (`tests/nvrtc_compile.rs`).

use sparkling_core::{Error, Result};
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CString};
use std::sync::{Arc, Mutex, OnceLock};

/// One kernel source file of `shaders/cuda/`.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name (`rms_norm.cu`).
    pub name: &'static str,
    /// CUDA C++ source text.
    pub source: &'static str,
}

/// Definitions every kernel uses (types, bf16 conversion, order keys, block reductions).
pub const PRELUDE: KernelSource = KernelSource { name: "prelude.cuh", source: include_str!("../../../shaders/cuda/prelude.cuh") };

/// The block-wide exact top-k / radix select shared by `topk.cu`, `markov_table.cu`, `sample.cu`.
pub const BLOCK_TOPK: KernelSource = KernelSource { name: "block_topk.cuh", source: include_str!("../../../shaders/cuda/block_topk.cuh") };

/// Every op file, in program order.
pub const OPS: &[KernelSource] = &[
    KernelSource { name: "embedding.cu", source: include_str!("../../../shaders/cuda/embedding.cu") },
    KernelSource { name: "pack_input.cu", source: include_str!("../../../shaders/cuda/pack_input.cu") },
    KernelSource { name: "add_bias.cu", source: include_str!("../../../shaders/cuda/add_bias.cu") },
    KernelSource { name: "rms_norm.cu", source: include_str!("../../../shaders/cuda/rms_norm.cu") },
    KernelSource { name: "rope.cu", source: include_str!("../../../shaders/cuda/rope.cu") },
    KernelSource { name: "silu_mul.cu", source: include_str!("../../../shaders/cuda/silu_mul.cu") },
    KernelSource { name: "add.cu", source: include_str!("../../../shaders/cuda/add.cu") },
    KernelSource { name: "copy_cols.cu", source: include_str!("../../../shaders/cuda/copy_cols.cu") },
    KernelSource { name: "gather_rows.cu", source: include_str!("../../../shaders/cuda/gather_rows.cu") },
    KernelSource { name: "attention.cu", source: include_str!("../../../shaders/cuda/attention.cu") },
    KernelSource { name: "argmax.cu", source: include_str!("../../../shaders/cuda/argmax.cu") },
    KernelSource { name: "topk.cu", source: include_str!("../../../shaders/cuda/topk.cu") },
    KernelSource { name: "markov_table.cu", source: include_str!("../../../shaders/cuda/markov_table.cu") },
    KernelSource { name: "candidate_union.cu", source: include_str!("../../../shaders/cuda/candidate_union.cu") },
    KernelSource { name: "tree_heap.cu", source: include_str!("../../../shaders/cuda/tree_heap.cu") },
    KernelSource { name: "sample.cu", source: include_str!("../../../shaders/cuda/sample.cu") },
];

/// Every `extern "C"` kernel of [`OPS`], as loaded by the backend.
pub const KERNEL_NAMES: &[&str] = &[
    "embedding_f32",
    "embedding_bf16",
    "pack_bf16",
    "pack_f32",
    "add_bias",
    "rms_norm",
    "rope",
    "silu_mul",
    "add_assign",
    "copy_cols",
    "gather_rows",
    "attention_split",
    "attention_combine",
    "argmax_rows",
    "topk_segments",
    "topk_merge",
    "markov_bias",
    "markov_rows_shared",
    "markov_rows_global",
    "candidate_union",
    "tree_heap",
    "sample_rows",
];

/// The source of a program made of the prelude, the block top-k helpers and `ops`.
pub fn program_source(ops: &[KernelSource]) -> String {
    let mut s = String::new();
    for part in [PRELUDE, BLOCK_TOPK].iter().chain(ops) {
        s.push_str(&format!("// ---- {} ----\n", part.name));
        s.push_str(part.source);
        s.push('\n');
    }
    s
}

/// What NVRTC produces: a CUBIN for one real architecture (`sm_XY`) or PTX for a virtual one
/// (`compute_XY`); `XY` = 10·major + minor of the compute capability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Target {
    /// Machine code for `sm_XY` (loads without JIT; only on that architecture family).
    Cubin(u32),
    /// PTX for `compute_XY` (JIT-compiled by the driver for any newer device).
    Ptx(u32),
}

impl Target {
    /// The `--gpu-architecture` value.
    pub fn arch_flag(self) -> String {
        match self {
            Target::Cubin(a) => format!("sm_{a}"),
            Target::Ptx(a) => format!("compute_{a}"),
        }
    }
}

/// Whether a libnvrtc shared library can be loaded (cudarc's dynamic loading: `libnvrtc.so`,
/// `.so.13`, `.so.12`, ... on the library path).
pub fn nvrtc_available() -> bool {
    // SAFETY: only tries to dlopen candidate names; nothing is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn unavailable() -> Error {
    Error::Unavailable(
        "libnvrtc (the CUDA runtime compiler) was not found: install the CUDA toolkit or the `nvidia-cuda-nvrtc` wheel \
         (scripts/install-nvrtc) and put its lib directory on LD_LIBRARY_PATH"
            .into(),
    )
}

/// `(major, minor)` of the loaded NVRTC. Errors: [`Error::Unavailable`] without libnvrtc.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    if !nvrtc_available() {
        return Err(unavailable());
    }
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: two valid out-pointers.
    unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| Error::Device(format!("nvrtcVersion: {e:?}")))?;
    Ok((major, minor))
}

/// The real architectures (`XY` of `sm_XY`) this NVRTC can compile for, ascending.
/// Errors: [`Error::Unavailable`] without libnvrtc.
pub fn supported_archs() -> Result<Vec<u32>> {
    if !nvrtc_available() {
        return Err(unavailable());
    }
    use cudarc::nvrtc::sys;
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer, then a buffer of exactly n entries.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }.result().map_err(|e| Error::Device(format!("nvrtcGetNumSupportedArchs: {e:?}")))?;
    let mut archs = vec![0 as c_int; n.max(0) as usize];
    if n > 0 {
        unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }.result().map_err(|e| Error::Device(format!("nvrtcGetSupportedArchs: {e:?}")))?;
    }
    let mut v: Vec<u32> = archs.into_iter().filter(|&a| a > 0).map(|a| a as u32).collect();
    v.sort_unstable();
    Ok(v)
}

/// The target for a device of compute capability `cc`: its own `sm_XY` as a CUBIN when NVRTC
/// supports it, else PTX for the newest supported architecture below it.
/// Errors: NVRTC missing, or it knows no architecture at or below the device's.
pub fn target_for(cc: (i32, i32)) -> Result<Target> {
    let want = (cc.0.max(0) * 10 + cc.1.max(0)) as u32;
    let archs = supported_archs()?;
    if archs.contains(&want) {
        return Ok(Target::Cubin(want));
    }
    match archs.iter().copied().filter(|&a| a <= want).max() {
        Some(a) => Ok(Target::Ptx(a)),
        None => Err(Error::Unavailable(format!("this NVRTC (supports sm_{:?}) cannot compile for a device of compute capability {}.{}", archs, cc.0, cc.1))),
    }
}

/// Compile `source` (named `name` in diagnostics) for `target`. Returns the CUBIN bytes, or the
/// PTX text with its terminating NUL (what `cuModuleLoadData` takes).
/// Errors: [`Error::Unavailable`] without libnvrtc; [`Error::Device`] with NVRTC's log when the
/// source does not compile.
pub fn compile(name: &str, source: &str, target: Target) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    if !nvrtc_available() {
        return Err(unavailable());
    }
    let src = CString::new(source).map_err(|_| Error::Invalid(format!("kernel source {name} contains a NUL byte")))?;
    let cname = CString::new(name).map_err(|_| Error::Invalid(format!("kernel name {name:?} contains a NUL byte")))?;
    let prog = result::create_program(&src, Some(&cname)).map_err(|e| Error::Device(format!("nvrtcCreateProgram({name}): {e:?}")))?;
    let opts = [format!("--gpu-architecture={}", target.arch_flag()), "--std=c++17".to_string()];
    // SAFETY: `prog` is a live program until destroy_program below; src/cname outlive it.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let out = match compiled {
        Err(e) => {
            let log = unsafe { result::get_program_log(prog) }.map(|l| c_chars_to_string(&l)).unwrap_or_default();
            Err(Error::Device(format!("NVRTC failed to compile {name} for {} ({e:?}):\n{log}", target.arch_flag())))
        }
        Ok(()) => match target {
            Target::Ptx(_) => unsafe { result::get_ptx(prog) }
                .map(|p| p.into_iter().map(|c| c as u8).collect())
                .map_err(|e| Error::Device(format!("nvrtcGetPTX({name}): {e:?}"))),
            Target::Cubin(_) => {
                let mut size = 0usize;
                unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }
                    .result()
                    .and_then(|()| {
                        let mut buf = vec![0 as c_char; size];
                        unsafe { sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr()) }.result().map(|()| buf.into_iter().map(|c| c as u8).collect())
                    })
                    .map_err(|e| Error::Device(format!("nvrtcGetCUBIN({name}): {e:?}")))
            }
        },
    };
    // SAFETY: created above, destroyed once.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The whole program ([`program_source`] of [`OPS`]) compiled for `target`, once per process
/// and target (later calls return the cached image).
pub fn compile_all(target: Target) -> Result<Arc<Vec<u8>>> {
    static CACHE: OnceLock<Mutex<HashMap<Target, Arc<Vec<u8>>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let mut guard = cache.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(img) = guard.get(&target) {
        return Ok(Arc::clone(img));
    }
    let img = Arc::new(compile("sparkling_kernels.cu", &program_source(OPS), target)?);
    guard.insert(target, Arc::clone(&img));
    Ok(img)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_name_is_defined_in_a_source() {
        let all = program_source(OPS);
        for name in KERNEL_NAMES {
            assert!(all.contains(&format!(" {name}(")), "kernel {name} not found in shaders/cuda/");
        }
        assert!(!all.contains('\0'));
        assert_eq!(Target::Cubin(90).arch_flag(), "sm_90");
        assert_eq!(Target::Ptx(80).arch_flag(), "compute_80");
    }
}
