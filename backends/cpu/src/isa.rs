//! Run-time choice of the CPU backend's instruction-set path.
//!
//! The path is detected once per process from the CPU's features; the environment variable
//! `SPARKLING_CPU_ISA` (`scalar`, `avx2`, `avx512vnni` or `auto`) forces a lower path, so CI on any machine
//! can exercise every path the CPU runs. Asking for a path the CPU lacks falls back to the best
//! path it has (with a warning on stderr), never to an illegal instruction.

use std::sync::OnceLock;

/// An instruction-set path of the CPU kernels, ordered from lowest to highest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Portable Rust (the reference every other path is tested against).
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (int8 dot products with `vpmaddubsw` / `vpmaddwd`).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI on top of the AVX2 set: the quantized matmul's int8 dot
    /// products with `vpdpbusd` on 512-bit registers (AMD Zen 4/5, Intel Ice Lake and later);
    /// the float kernels keep their AVX2 code.
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
        match std::env::var("SPARKLING_CPU_ISA").ok().as_deref().map(str::trim) {
            None | Some("") | Some("auto") => best,
            Some("scalar") => Isa::Scalar,
            Some("avx2") if best >= Isa::Avx2 => Isa::Avx2,
            Some("avx512vnni") if best >= Isa::Avx512Vnni => Isa::Avx512Vnni,
            Some(other) => {
                eprintln!("warning: SPARKLING_CPU_ISA={other} is not a path this CPU runs (scalar, avx2, avx512vnni, auto); using {}", best.name());
                best
            }
        }
    })
}
