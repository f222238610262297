//! The packed formats' shared test helpers and the packed product's tests.

use super::act::QuantRows;
use super::*;

/// Deterministic values in [-1, 1].
pub fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(40503))
                >> 8;
            (h % 2001) as f32 / 1000.0 - 1.0
        })
        .collect()
}

/// Runs `kernel` (weight rows × quantized inputs, `out[r * m + i]`) with every instruction
/// set the CPU has against a plain f64 reference over the dequantized weights `w(r, k)` and
/// the dequantized inputs; checks each row of a batch equals the row alone, bit for bit.
pub fn check_kernel(
    rows: usize,
    n: usize,
    m: usize,
    kernel: impl Fn(&QuantRows, &mut [f32], Isa),
    w: impl Fn(usize, usize) -> f32,
) {
    let x = values(m * n, 11);
    let xq = QuantRows::new(&x, m, n);
    let xd = |i: usize, k: usize| xq.qs[i * n + k] as f64 * xq.d[i * n / BLOCK + k / BLOCK] as f64;
    for isa in Isa::available() {
        let mut out = vec![0f32; rows * m];
        kernel(&xq, &mut out, isa);
        for r in 0..rows {
            for i in 0..m {
                let want: f64 = (0..n).map(|k| w(r, k) as f64 * xd(i, k)).sum();
                let scale: f64 = (0..n).map(|k| (w(r, k) as f64 * xd(i, k)).abs()).sum();
                let got = out[r * m + i] as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + scale),
                    "{isa:?} ({m},{rows},{n}) [{r},{i}]: {got} vs {want}"
                );
                let alone = QuantRows::new(&x[i * n..(i + 1) * n], 1, n);
                let mut one = vec![0f32; rows];
                kernel(&alone, &mut one, isa);
                assert_eq!(one[r].to_bits(), out[r * m + i].to_bits(), "{isa:?}");
            }
        }
    }
}

/// `(input rows, weight rows, in-dim)` on which the q8 and q4 kernels are checked against
/// their reference: in-dims of 1, 3, 7, 8 and 9 blocks (partial groups of 16), 16, 22 and 35;
/// 1 to 70 rows.
pub const ODD_SIZES: [(usize, usize, usize); 14] = [
    (1, 1, 32),
    (1, 5, 96),
    (3, 7, 224),
    (6, 70, 288),
    (17, 9, 256),
    // Whole groups of 16 blocks, and whole groups with a partial one after.
    (1, 3, 512),
    (5, 6, 704),
    (17, 4, 1120),
    // The few-row tiles (`few.rs`): 1, 3 and 2 weight rows, the input rows in chunks of up
    // to 5 (6 rows: 3 + 3; 8: 4 + 4; 9: 5 + 4; 11: 4 + 4 + 3; 15: 5 + 5 + 5), over whole
    // groups and a partial one (from 8 rows these are q8's tiles and q4's row blocks, whose
    // `BLOCK_FROM_ROWS` is 8).
    (2, 9, 1120),
    (3, 5, 544),
    (8, 5, 1056),
    (9, 7, 544),
    (11, 5, 1120),
    (15, 3, 512),
];

#[test]
fn rounding_is_to_nearest_ties_even() {
    for (v, want) in [
        (0.4, 0.0),
        (0.5, 0.0),
        (1.5, 2.0),
        (-2.5, -2.0),
        (126.6, 127.0),
        (-7.51, -8.0),
    ] {
        assert_eq!(round_small(v), want, "{v}");
    }
    assert!(round_small(f32::NAN).is_nan());
}

#[test]
fn formats_parse_and_fall_back() {
    for f in WeightFormat::ALL {
        assert_eq!(f.name().parse::<WeightFormat>().unwrap(), f);
    }
    assert_eq!("Q4".parse::<WeightFormat>().unwrap(), WeightFormat::Q4);
    let e = "q3".parse::<WeightFormat>().unwrap_err().to_string();
    assert!(e.contains("q3") && e.contains("q4"), "{e}");
    assert_eq!(WeightFormat::Q4.for_in_dim(33), WeightFormat::Bf16);
    assert_eq!(WeightFormat::Q8.for_in_dim(64), WeightFormat::Q8);
    assert_eq!(WeightFormat::F16.for_in_dim(33), WeightFormat::F16);
}

/// The packed product (one pass for a few rows, passes of 64 for many, of up to 128 for
/// bf16 on AMX) against the f32 product of the dequantized matrix, for every format and on
/// odd output sizes; a row of many equals the row alone, bit for bit, and a bias added in
/// the pass equals one added after; no rows, no outputs.
#[test]
fn packed_matmul_matches_dequantized_product() -> candle_core::Result<()> {
    let dev = candle_core::Device::Cpu;
    for format in [
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::Q8,
        WeightFormat::Q4,
    ] {
        for (m, out, n) in [(1, 37, 64), (5, 600, 96), (70, 531, 64), (150, 70, 64)] {
            let w = values(out * n, 5);
            let p = PackedMatrix::pack(format, &w, out, n).unwrap();
            assert_eq!(p.format(), format);
            let wd = Tensor::from_vec(p.dequantize(), (out, n), &dev)?;
            let x = Tensor::from_vec(values(m * n, 9), (m, n), &dev)?;
            let want = x.matmul(&wd.t()?)?;
            let got = p.matmul(&x)?;
            let err: f32 = (&got - &want)?.abs()?.max_all()?.to_scalar()?;
            let scale: f32 = want.abs()?.max_all()?.to_scalar()?;
            // q8 / q4 also quantize the input to 8 bits: ~0.5% of the largest output; bf16
            // rounds it to 8 bits of mantissa where the CPU has BF16 dot products.
            let rounded = format.is_quantized()
                || (format == WeightFormat::Bf16
                    && half::uses_bf16_inputs(HalfKind::Bf16, Isa::best()));
            let tol = if rounded { 1e-2 } else { 1e-5 };
            assert!(
                err <= tol * scale,
                "{format} ({m},{out},{n}): {err} of {scale}"
            );
            let rows = got.to_vec2::<f32>()?;
            for i in [0, m / 2, m - 1] {
                let alone = p.matmul_rows(&values(m * n, 9)[i * n..(i + 1) * n], 1);
                let same = alone
                    .iter()
                    .zip(&rows[i])
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{format} ({m},{out},{n}): row {i} differs alone");
            }
            // A bias added in the pass (on AMX, as the tiles are stored) is the sum a
            // broadcast add after gives, bit for bit.
            let b = Tensor::from_vec(values(out, 4), out, &dev)?;
            let with = p.matmul_bias(&x, Some(&b))?.to_vec2::<f32>()?;
            let after = got.broadcast_add(&b)?.to_vec2::<f32>()?;
            let mut same = with.iter().flatten().zip(after.iter().flatten());
            assert!(
                same.all(|(a, b)| a.to_bits() == b.to_bits()),
                "{format} bias"
            );
        }
        let p = PackedMatrix::pack(format, &values(37 * 64, 5), 37, 64).unwrap();
        assert!(p.matmul_rows(&[], 0).is_empty());
    }
    assert!(PackedMatrix::pack(WeightFormat::Q8, &values(33, 1), 1, 33).is_err());
    Ok(())
}

#[test]
#[should_panic(expected = "packed matmul: (2, 64) inputs expected")]
fn packed_matmul_refuses_inputs_of_another_shape() {
    let p = PackedMatrix::pack(WeightFormat::Q4, &values(3 * 64, 1), 3, 64).unwrap();
    p.matmul_rows(&values(100, 2), 2);
}

#[test]
#[should_panic(expected = "QuantRows::new: 100 values for (2, 64)")]
fn quantized_inputs_refuse_another_shape() {
    QuantRows::new(&values(100, 2), 2, 64);
}

#[test]
#[should_panic(expected = "QuantRows::new: 48 values for (1, 48), n a multiple of 32")]
fn quantized_inputs_refuse_part_of_a_block() {
    QuantRows::new(&values(48, 2), 1, 48);
}

/// A group's products (`matmul_group`: the inputs prepared once, one parallel region) are each
/// matrix's own `matmul_bias`, bit for bit, in every format, a mixed group too; a group refuses
/// inputs of another width.
#[test]
fn a_group_of_matrices_gives_each_its_own_product() -> candle_core::Result<()> {
    let dev = candle_core::Device::Cpu;
    let n = 96;
    let formats = [
        WeightFormat::Bf16,
        WeightFormat::F16,
        WeightFormat::Q8,
        WeightFormat::Q4,
    ];
    let groups: Vec<Vec<WeightFormat>> = formats
        .iter()
        .map(|&f| vec![f; 3])
        .chain([vec![WeightFormat::Q4, WeightFormat::Bf16, WeightFormat::Q8]])
        .collect();
    for group in groups {
        let mats: Vec<PackedMatrix> = group
            .iter()
            .zip([70, 16, 130])
            .enumerate()
            .map(|(j, (&f, out))| PackedMatrix::pack(f, &values(out * n, j as u32), out, n))
            .collect::<Result<_, _>>()
            .unwrap();
        let bias = Tensor::from_vec(values(16, 3), 16, &dev)?;
        let with: Vec<(&PackedMatrix, Option<&Tensor>)> = mats
            .iter()
            .enumerate()
            .map(|(j, p)| (p, (j == 1).then_some(&bias)))
            .collect();
        for m in [1, 5, 70] {
            let x = Tensor::from_vec(values(m * n, 9), (m, n), &dev)?;
            let got = PackedMatrix::matmul_group(&with, &x)?;
            for ((p, b), y) in with.iter().zip(&got) {
                let alone = p.matmul_bias(&x, *b)?.to_vec2::<f32>()?;
                let y = y.to_vec2::<f32>()?;
                let mut same = alone.iter().flatten().zip(y.iter().flatten());
                assert!(
                    same.all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{group:?} m {m}: {} differs in the group",
                    p.format()
                );
            }
        }
        let x = Tensor::from_vec(values(2 * 64, 9), (2, 64), &dev)?;
        assert!(PackedMatrix::matmul_group(&with, &x).is_err());
    }
    Ok(())
}

/// Quantizing input rows (AVX-512 where the CPU has it) gives what the scalar blocks give, bit
/// for bit, on blocks of zeros, NaN, infinities, ties and subnormals.
#[test]
fn quantized_rows_match_the_scalar_blocks() {
    let mut x = values(32 * 40, 7);
    for (i, v) in x.iter_mut().enumerate() {
        *v *= [1.0, 1e-3, 3e4, 1e-40][i / 32 % 4];
    }
    x[32..64].fill(0.0);
    x[64] = f32::NAN;
    x[100] = f32::INFINITY;
    x[130] = -f32::INFINITY;
    x[131] = f32::NAN;
    // Ties at half steps: 127 · k / 254 for a block whose largest value is 1.
    for (k, v) in x[160..192].iter_mut().enumerate() {
        *v = if k == 0 {
            1.0
        } else {
            (2 * k + 1) as f32 / 254.0
        };
    }
    let q = QuantRows::new(&x, 4, 320);
    for (b, xb) in x.chunks_exact(BLOCK).enumerate() {
        let mut qb = [0i8; BLOCK];
        let (d, sum) = super::act::quantize_block(xb, &mut qb);
        assert_eq!(&q.qs[b * BLOCK..(b + 1) * BLOCK], &qb, "block {b}");
        assert_eq!(q.d[b].to_bits(), d.to_bits(), "block {b} scale");
        assert_eq!(q.sums[b], sum, "block {b} sum");
    }
}
