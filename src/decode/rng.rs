//! Counter-based random numbers: the uniform for a sampled token depends only on the seed and
//! the absolute position of that token, so every method (and every backend) that samples the
//! same logits at the same position draws the same token (sample-and-match, reference §4.9.2).

/// The SplitMix64 increment (2^64 / golden ratio).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64 finaliser (Steele, Lea, Flood 2014): a bijective 64-bit mixer of `z + GAMMA`.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// One step of the SplitMix64 stream over `state`: the next value of the sequence, `state`
/// advanced by the increment. The project's one SplitMix64 stream (tests and benches draw from
/// it).
pub fn splitmix64_next(state: &mut u64) -> u64 {
    let z = splitmix64(*state);
    *state = state.wrapping_add(GAMMA);
    z
}

/// Uniform in `[0, 1)` (24-bit resolution) for the token at absolute `position` under `seed`.
pub fn uniform(seed: u64, position: u64) -> f32 {
    let x = splitmix64(splitmix64(seed) ^ position.wrapping_mul(0xD6E8_FEB8_6659_FD93));
    (x >> 40) as f32 / (1u64 << 24) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_is_the_reference_splitmix64() {
        // First outputs of SplitMix64 seeded with 0 (the published reference sequence).
        let mut s = 0u64;
        assert_eq!(splitmix64_next(&mut s), 0xE220_A839_7B1D_CDAF);
        assert_eq!(splitmix64_next(&mut s), 0x6E78_9E6A_A1B9_65F4);
    }

    #[test]
    fn uniforms_are_in_range_and_spread() {
        let n = 20_000u64;
        let mut buckets = [0u32; 10];
        for p in 0..n {
            let u = uniform(7, p);
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        // each decile within 10% of its expectation
        for b in buckets {
            assert!((b as f64 - 2000.0).abs() < 200.0, "{buckets:?}");
        }
        assert_ne!(uniform(1, 5), uniform(2, 5));
        assert_eq!(uniform(3, 9), uniform(3, 9));
    }
}
