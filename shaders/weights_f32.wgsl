// Weight storage prelude: f32, one value per array element.
// `load_w(e)` returns element `e` of the row-major [rows, K] weight chunk bound at binding 1.
@group(0) @binding(1) var<storage, read> w: array<f32>;

fn load_w(e: u32) -> f32 {
    return w[e];
}
