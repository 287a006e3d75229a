//! Z-order (Morton) codes: the arithmetic behind `zorder(x1, ..., xn)` clustering keys.
//!
//! Each value is mapped onto `u64` by an order-preserving bit pattern of its `f64` form
//! (scale-free: nearby magnitudes share high bits), then the top `64 / n` bits of every value
//! are interleaved, most significant first. Sorting by the code keeps rows that are close in
//! every argument close together. Pure arithmetic, no IO.

/// An order-preserving map of a float onto `u64`: negative numbers flip every bit, others
/// the sign bit, so unsigned order equals numeric order (NaN sorts last).
pub fn ordered_bits(x: f64) -> u64 {
    let b = x.to_bits();
    if b >> 63 == 1 { !b } else { b | (1 << 63) }
}

/// Interleaves the top `64 / n` bits of each value, most significant first.
pub fn interleave(values: &[f64]) -> u64 {
    let n = values.len().max(1);
    let bits = 64 / n;
    let tops: Vec<u64> = values
        .iter()
        .map(|v| ordered_bits(*v) >> (64 - bits))
        .collect();
    let mut out = 0u64;
    for bit in (0..bits).rev() {
        for t in &tops {
            out = (out << 1) | ((t >> bit) & 1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_bits_keep_numeric_order() {
        let xs = [-1e9, -2.5, -0.0, 0.0, 1e-9, 1.0, 3.0, 1e9];
        for w in xs.windows(2) {
            assert!(ordered_bits(w[0]) <= ordered_bits(w[1]), "{w:?}");
        }
    }

    #[test]
    fn interleaving_is_morton_order() {
        // With one argument zorder is order-preserving.
        assert!(interleave(&[1.0]) < interleave(&[2.0]));
        // Two arguments: a point close in both coordinates is closer in code than a far one.
        let base = interleave(&[10.0, 10.0]);
        let near = interleave(&[10.5, 10.5]);
        let far = interleave(&[1000.0, 10.0]);
        assert!(base.abs_diff(near) < base.abs_diff(far));
    }
}
