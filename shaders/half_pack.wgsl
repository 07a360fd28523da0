// half_pack.wgsl — f32 to IEEE half bits rounded to nearest, ties to even, in
// integer ops (WGSL's pack2x16float may round either way: lavapipe truncates),
// so that a KV cache of packed halves holds the same bits on every adapter as
// the CPU reference and CUDA's cvt.rn.f16.f32. Included by the kernels that
// write an f16 cache held in a buffer.

fn half_bits(x: f32) -> u32 {
    let u = bitcast<u32>(x);
    let sign = (u >> 16u) & 0x8000u;
    let a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) { return sign | select(0x7c00u, 0x7e00u, a > 0x7f800000u); }
    // At or past 65520 rounds to infinity.
    if (a >= 0x477ff000u) { return sign | 0x7c00u; }
    if (a < 0x38800000u) {
        // Below 2^-14: a subnormal half (units of 2^-24), or zero.
        let e = a >> 23u;
        if (e < 102u) { return sign; }
        let m = (a & 0x7fffffu) | 0x800000u;
        let shift = 126u - e;
        var h = m >> shift;
        let rest = m & ((1u << shift) - 1u);
        let tie = 1u << (shift - 1u);
        if (rest > tie || (rest == tie && (h & 1u) == 1u)) { h = h + 1u; }
        return sign | h;
    }
    // Rebias the exponent (127 -> 15) and drop 13 mantissa bits.
    let m = a - 0x38000000u;
    var h = m >> 13u;
    let rest = m & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) == 1u)) { h = h + 1u; }
    return sign | h;
}

// Two values as one word, `a` in the low half (unpack2x16float's order).
fn pack_halves(a: f32, b: f32) -> u32 {
    return half_bits(a) | (half_bits(b) << 16u);
}
