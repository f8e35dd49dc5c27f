//! Every CUDA kernel source (`shaders/cuda/*.cu`) compiles through NVRTC — no GPU needed, only
//! libnvrtc (`scripts/install-nvrtc` fetches the `nvidia-cuda-nvrtc` wheel and prints the
//! LD_LIBRARY_PATH to export). Each op file is compiled on its own (prelude + block_topk +
//! file, so an error names its file) to a Hopper CUBIN (sm_90, the H100/H200 of the paper
//! setup) and to PTX for the oldest architecture this NVRTC supports; then the whole program
//! the backend loads is compiled for sm_90 and checked to define every kernel it looks up.
//!
//! Without libnvrtc the test skips loudly; `SPARKLING_REQUIRE_NVRTC=1` makes that a failure
//! (CI sets it after running scripts/install-nvrtc).

use sparkling_cuda::kernels::{compile, compile_all, nvrtc_available, nvrtc_version, program_source, supported_archs, Target, KERNEL_NAMES, OPS};

fn nvrtc_or_skip(test: &str) -> bool {
    if nvrtc_available() {
        return true;
    }
    if std::env::var("SPARKLING_REQUIRE_NVRTC").as_deref() == Ok("1") {
        panic!("{test}: libnvrtc not found but SPARKLING_REQUIRE_NVRTC=1 (run scripts/install-nvrtc and export the LD_LIBRARY_PATH it prints)");
    }
    eprintln!("SKIPPED {test}: libnvrtc not found (scripts/install-nvrtc; set SPARKLING_REQUIRE_NVRTC=1 to make this a failure)");
    false
}

#[test]
fn every_kernel_source_compiles_with_nvrtc() {
    if !nvrtc_or_skip("every_kernel_source_compiles_with_nvrtc") {
        return;
    }
    let (major, minor) = nvrtc_version().expect("nvrtc version");
    let archs = supported_archs().expect("supported archs");
    eprintln!("NVRTC {major}.{minor}, real architectures {archs:?}");
    assert!(archs.contains(&90), "this NVRTC cannot target sm_90 (Hopper): {archs:?}");
    let oldest = *archs.first().expect("at least one architecture");
    let mut failures = Vec::new();
    for op in OPS {
        for target in [Target::Cubin(90), Target::Ptx(oldest)] {
            let t0 = std::time::Instant::now();
            match compile(op.name, &program_source(&[*op]), target) {
                Ok(img) => {
                    assert!(img.len() > 64, "{}: empty image", op.name);
                    eprintln!("compiled {} for {} ({} bytes, {:.0} ms)", op.name, target.arch_flag(), img.len(), t0.elapsed().as_secs_f64() * 1e3);
                }
                Err(e) => failures.push(format!("{} ({}): {e}", op.name, target.arch_flag())),
            }
        }
    }
    assert!(failures.is_empty(), "NVRTC rejected kernel sources:\n{}", failures.join("\n"));
}

#[test]
fn the_whole_program_defines_every_kernel_the_backend_loads() {
    if !nvrtc_or_skip("the_whole_program_defines_every_kernel_the_backend_loads") {
        return;
    }
    let ptx = compile_all(Target::Ptx(80)).expect("the whole program compiles to PTX");
    let text = String::from_utf8_lossy(&ptx);
    for name in KERNEL_NAMES {
        assert!(text.contains(&format!(".entry {name}(")), "kernel {name} missing from the compiled PTX");
    }
    let cubin = compile_all(Target::Cubin(90)).expect("the whole program compiles to an sm_90 CUBIN");
    assert_eq!(&cubin[..4], b"\x7fELF", "a CUBIN is an ELF image");
    // A kernel with a syntax error is reported with NVRTC's log, not a panic.
    let err = compile("broken.cu", "extern \"C\" __global__ void broken( { }", Target::Ptx(80)).unwrap_err();
    assert!(format!("{err}").contains("broken.cu"), "{err}");
}
