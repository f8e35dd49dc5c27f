//! What a backend is, as far as the decode loop cares: asked of the backend once
//! ([`Platform::of`]) and read by name, instead of one `host_memory` flag threaded through
//! every function that decides something by it.
//!
//! A backend whose tensors live in host memory (the CPU backend, natively or in wasm) reads its
//! logits without a transfer and verifies compute-bound: every verified row costs arithmetic,
//! so small trees and host tree building win there. A device backend (wgpu, CUDA) pays one
//! read-back per transfer and verifies rows almost for free up to its tile size, so it builds
//! trees on the device and verifies larger ones (docs/design.md §3, §8).

use super::lookup::LookupGraft;
use super::propose::TreePrep;
use super::{GenParams, Method};
use sparkling_core::Backend;

/// The decode loop's view of a backend (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Platform {
    /// Tensors live in host memory ([`Backend::host_memory`]): downloads are free, verify rows
    /// cost arithmetic.
    pub host_memory: bool,
    /// Running in a browser page (wasm32), which must get a turn between long pieces of work.
    pub browser: bool,
}

/// Prompt rows per prefill step on a host-memory backend in the browser (the CPU backend in
/// wasm, one thread), so the page gets a turn between chunks instead of freezing for the whole
/// prompt.
pub const BROWSER_PREFILL_CHUNK: usize = 32;

impl Platform {
    /// Ask `b` once.
    pub fn of<B: Backend>(b: &B) -> Platform {
        Platform { host_memory: b.host_memory(), browser: cfg!(target_arch = "wasm32") }
    }

    /// The CPU backend's platform (host memory, native): for tests and tools without a backend
    /// at hand.
    pub const HOST: Platform = Platform { host_memory: true, browser: false };

    /// A device backend's platform (wgpu, CUDA; native).
    pub const DEVICE: Platform = Platform { host_memory: false, browser: false };

    /// Where draft candidates are selected: [`TreePrep::Auto`] becomes host selection on host
    /// memory (the whole `[depth, V]` logits are already there) and device selection elsewhere
    /// (only the top-k / the tree comes back); an explicit choice stays.
    pub fn tree_prep(self, prep: TreePrep) -> TreePrep {
        match prep {
            TreePrep::Auto if self.host_memory => TreePrep::Host,
            TreePrep::Auto => TreePrep::Device,
            p => p,
        }
    }

    /// The default fixed tree budget (non-root nodes) of `method`: 64 (TreeSpark 32) on a
    /// device; at most 8 in host memory, where each verified row costs arithmetic. `lookup`:
    /// chains of up to 16 everywhere (only a long repeated run gets a long chain).
    pub fn default_budget(self, method: Method) -> usize {
        let b = match method {
            Method::TreeSpark => 32,
            Method::Lookup => return 16,
            _ => 64,
        };
        if self.host_memory {
            b.min(8)
        } else {
            b
        }
    }

    /// The largest tree `--budget auto` builds (N_max): 16 in host memory (beyond ~16 rows a CPU
    /// verify row costs about a quarter of a decode step, more than any drafter earns), else the
    /// method's [`Platform::default_budget`].
    pub fn auto_max_budget(self, method: Method) -> usize {
        if self.host_memory {
            16
        } else {
            Platform::DEVICE.default_budget(method)
        }
    }

    /// The default prompt-lookup graft of `method`: `sparkling` grafts chains of up to 16
    /// tokens and, in host memory, skips the drafter in rounds whose lookup matched (the
    /// drafter's tree rarely adds to a matched chain what its forward and its verify rows cost
    /// there); on a device it grafts chains of up to 8 beside every drafted tree. The published
    /// methods stay as published: off.
    pub fn lookup_graft(self, method: Method) -> LookupGraft {
        match method {
            Method::Sparkling if self.host_memory => LookupGraft { len: 16, skip_drafter: true },
            Method::Sparkling => LookupGraft { len: 8, skip_drafter: false },
            _ => LookupGraft::OFF,
        }
    }

    /// The longest chain `lookup` proposes under `p`: its fixed budget, or under `--budget
    /// auto` (no drafter, so no cost model) [`Platform::default_budget`].
    pub fn lookup_chain_len(self, p: &GenParams) -> usize {
        if p.auto_budget.is_some() {
            self.default_budget(Method::Lookup)
        } else {
            p.tree.budget
        }
    }

    /// Whether a sampled (T > 0) sequence draws only the tree rows its acceptance walk reaches
    /// (≈ τ of them), one at a time: in host memory a draw costs an exp per logit and no
    /// transfer. A device draws every row in one call and one read-back. Each row's token is
    /// the same either way (its own logits and counter-based uniform).
    pub fn per_row_sampling(self) -> bool {
        self.host_memory
    }

    /// Whether the loop gives the host's event loop a turn after every step: a host-memory
    /// backend never awaits a device, so in a browser the page would freeze for a whole
    /// generation (device backends yield at every read-back). Natively the yield is a no-op.
    pub fn yields_each_step(self) -> bool {
        self.host_memory
    }

    /// Most prompt rows one prefill step feeds (0: the whole prompt):
    /// [`BROWSER_PREFILL_CHUNK`] for a host-memory backend in a browser, else 0.
    pub fn prefill_chunk(self) -> usize {
        if self.browser && self.host_memory {
            BROWSER_PREFILL_CHUNK
        } else {
            0
        }
    }
}
