//! Run-time choice of the CPU backend's instruction-set path.
//!
//! The path is detected once per process from the CPU's features; the environment variable
//! `SPARKLING_CPU_ISA` (`scalar`, `avx2`, `avx512vnni` or `auto`, any case) forces a lower path,
//! so CI on any machine can exercise every path the CPU runs. Asking for a path the CPU lacks,
//! or an unknown name, falls back to the best path it has (with a warning on stderr saying
//! which), never to an illegal instruction. The int8 matmul gives the same bits on every path;
//! the float kernels (attention, `exp`, SiLU, f16/f32 matmuls) have one arithmetic for the SIMD
//! paths and another for `scalar`, so `scalar` may pick another token at a near-tie (every
//! method still equals `ar` within a path).

use std::sync::OnceLock;

/// An instruction-set path of the CPU kernels, ordered from lowest to highest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust (the reference every other path is tested against).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (int8 dot products with `vpmaddubsw` / `vpmaddwd`).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI on top of the AVX2 set: the quantized matmul's int8 dot
    /// products with `vpdpbusd` on 512-bit registers (AMD Zen 4/5, Intel Ice Lake and later),
    /// and the attention's AVX2 arithmetic on 512-bit registers (same bits); the f16/f32
    /// matmuls keep their AVX2 code.
    Avx512Vnni,
}

impl Isa {
    /// Lower-case name (`scalar`, `avx2`, `avx512vnni`), as accepted by `SPARKLING_CPU_ISA`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }
}

/// The best path this CPU can run (ignores `SPARKLING_CPU_ISA`).
pub fn detected() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        // `is_x86_feature_detected` also checks that the OS saves the registers (XCR0), so a
        // flag the kernel does not enable is not trusted.
        let avx2 = has!("avx2") && has!("fma") && has!("f16c");
        if avx2 && has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
            return Isa::Avx512Vnni;
        }
        if avx2 {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// Every path this CPU can run, lowest first (what the kernel tests iterate over).
pub fn available() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|&i| i <= detected()).collect()
}

/// The path in use: [`detected`], lowered by `SPARKLING_CPU_ISA` when set. Read once.
pub fn active() -> Isa {
    static ACTIVE: OnceLock<Isa> = OnceLock::new();
    *ACTIVE.get_or_init(|| {
        let best = detected();
        let raw = std::env::var("SPARKLING_CPU_ISA").ok();
        let want = raw.as_deref().map(|v| v.trim().to_ascii_lowercase());
        let known = [Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni];
        match want.as_deref() {
            // Unset or empty (as `VAR=` in a shell leaves it): the best path.
            None | Some("") | Some("auto") => best,
            Some(name) => match known.iter().find(|i| i.name() == name) {
                Some(&isa) if isa <= best => isa,
                Some(&isa) => {
                    eprintln!("warning: SPARKLING_CPU_ISA={}: this CPU cannot run the {} path; using {}", raw.unwrap_or_default(), isa.name(), best.name());
                    best
                }
                None => {
                    eprintln!(
                        "warning: SPARKLING_CPU_ISA={}: unknown path (expected scalar, avx2, avx512vnni or auto); using {}",
                        raw.unwrap_or_default(),
                        best.name()
                    );
                    best
                }
            },
        }
    })
}
