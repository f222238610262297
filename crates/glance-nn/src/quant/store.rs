//! Packed weights in a safetensors checkpoint (what `glance quantize` writes), loaded without
//! re-quantizing.
//!
//! Layout, for a matrix `P` (a full tensor name such as
//! `language_model.model.layers.0.mlp.up_proj.weight`) of shape `(rows, cols)`:
//! - **q8:** `P.q8` — I8 `(rows, cols)`, the values `q`; `P.scales` — F16 `(rows, cols / 32)`,
//!   one scale per block of 32 along a row (`w = d · q`).
//! - **q4:** `P.q4` — U8 `(rows, cols / 2)`, per block of 32 values 16 bytes, byte `j` holding
//!   value `j` in its low nibble and value `j + 16` in its high nibble; `P.scales` — F16
//!   `(rows, cols / 32)` (`w = d · (q − 8)`).
//! - **bf16 / f16:** `P` itself, BF16 / F16 `(rows, cols)` — an ordinary tensor, used in place
//!   when loaded in that format.
//!
//! Every other tensor is written as the source checkpoint stores it. The file's metadata holds
//! `glance_weights` (the format) and `glance_layout_version` (`1`).

use super::q4::Q4Matrix;
use super::q8::Q8Matrix;
use super::{HalfKind, PackedMatrix, RawSource, WeightFormat, BLOCK};
use candle_core::DType;

/// The layout version written to the metadata.
pub const LAYOUT_VERSION: &str = "1";

/// The metadata key holding the layout version.
pub const LAYOUT_VERSION_KEY: &str = "glance_layout_version";
/// The metadata key holding the format the file was written in.
pub const WEIGHTS_KEY: &str = "glance_weights";

/// Checks a safetensors file's metadata: a file written by `glance quantize` must carry a layout
/// version this build reads ([`LAYOUT_VERSION`]) and a known format. A file without glance's
/// keys (an ordinary checkpoint) passes. The error says what was found and what is supported.
pub fn check_metadata(
    metadata: Option<&std::collections::HashMap<String, String>>,
) -> Result<(), String> {
    let Some(m) = metadata else {
        return Ok(());
    };
    let version = m.get(LAYOUT_VERSION_KEY);
    let weights = m.get(WEIGHTS_KEY);
    let shown = |v: &str| v.chars().take(32).collect::<String>();
    match version {
        Some(v) if v == LAYOUT_VERSION => {}
        Some(v) => {
            return Err(format!(
                "packed-weight layout version `{}` is not supported (this glance reads version \
                 {LAYOUT_VERSION}); quantize the source model again with this glance",
                shown(v)
            ))
        }
        None if weights.is_some() => {
            return Err(format!(
                "`{WEIGHTS_KEY}` is set but `{LAYOUT_VERSION_KEY}` is missing: not a directory \
                 written by `glance quantize` (layout version {LAYOUT_VERSION})"
            ))
        }
        None => {}
    }
    if let Some(w) = weights {
        if !matches!(w.parse::<WeightFormat>(), Ok(f) if f != WeightFormat::F32) {
            return Err(format!(
                "`{WEIGHTS_KEY}` is `{}`: expected bf16, f16, q8 or q4",
                shown(w)
            ));
        }
    }
    Ok(())
}

/// One tensor to write: name, dtype, shape, little-endian bytes.
pub struct StoredTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

fn u16_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The tensors that store `p` under the name `name` (see the module documentation).
pub fn to_stored(name: &str, p: &PackedMatrix) -> Vec<StoredTensor> {
    let (rows, cols) = p.dims();
    let scales = |s: &[u16]| StoredTensor {
        name: format!("{name}.scales"),
        dtype: DType::F16,
        shape: vec![rows, cols / BLOCK],
        bytes: u16_bytes(s),
    };
    match p {
        PackedMatrix::Half(h) => vec![StoredTensor {
            name: name.to_string(),
            dtype: match h.kind() {
                HalfKind::Bf16 => DType::BF16,
                HalfKind::F16 => DType::F16,
            },
            shape: vec![rows, cols],
            bytes: u16_bytes(h.bits()),
        }],
        PackedMatrix::Q8(q) => vec![
            StoredTensor {
                name: format!("{name}.q8"),
                // Written as I8 (candle's DType has no I8: see `stored_dtype_is_i8`).
                dtype: DType::U8,
                shape: vec![rows, cols],
                bytes: q.stored_qs().iter().map(|&v| v as u8).collect(),
            },
            scales(&q.scales),
        ],
        PackedMatrix::Q4(q) => vec![
            StoredTensor {
                name: format!("{name}.q4"),
                dtype: DType::U8,
                shape: vec![rows, cols / 2],
                bytes: q.stored_qs(),
            },
            scales(&q.scales),
        ],
    }
}

/// Whether the bytes of a stored tensor named `name` are signed (the file's dtype I8; they travel
/// as `DType::U8` here, candle having no I8).
pub fn stored_dtype_is_i8(name: &str) -> bool {
    name.ends_with(".q8")
}

/// Whether a stored tensor name holds packed values (integers that are not weights to convert).
pub fn is_packed_name(name: &str) -> bool {
    name.ends_with(".q8") || name.ends_with(".q4")
}

/// The packed matrix `name` `(rows, cols)` in `format` if `source` stores it packed (q8 / q4);
/// `None` when it does not. An error when it is stored packed in another format or with the
/// wrong shapes.
pub fn from_stored(
    source: &dyn RawSource,
    name: &str,
    (rows, cols): (usize, usize),
    format: WeightFormat,
) -> Option<Result<PackedMatrix, String>> {
    let stored = [WeightFormat::Q8, WeightFormat::Q4]
        .into_iter()
        .find(|f| source.raw(&format!("{name}.{}", f.name())).is_some())?;
    if stored != format {
        return Some(Err(format!(
            "`{name}` is stored as {stored} (a checkpoint written by `glance quantize`); load it \
             with --weights {stored}"
        )));
    }
    Some(read_packed(source, name, rows, cols, format))
}

fn read_packed(
    source: &dyn RawSource,
    name: &str,
    rows: usize,
    cols: usize,
    format: WeightFormat,
) -> Result<PackedMatrix, String> {
    let values = source
        .raw(&format!("{name}.{}", format.name()))
        .ok_or_else(|| format!("`{name}.{format}` is missing"))?;
    let scales = source
        .raw(&format!("{name}.scales"))
        .ok_or_else(|| format!("`{name}.scales` is missing"))?;
    if scales.dtype != DType::F16 || scales.shape != [rows, cols / BLOCK] {
        return Err(format!(
            "`{name}.scales` must be F16 ({rows}, {}), found {:?} {:?}",
            cols / BLOCK,
            scales.dtype,
            scales.shape
        ));
    }
    let sc: Vec<u16> = scales
        .bytes
        .as_slice()
        .chunks_exact(2)
        .map(|b| u16::from_le_bytes([b[0], b[1]]))
        .collect();
    let bytes = values.bytes.as_slice();
    let checked = match format {
        WeightFormat::Q8 if values.shape == [rows, cols] => {
            Q8Matrix::from_parts(rows, cols, bytes.iter().map(|&b| b as i8).collect(), sc)
                .map(PackedMatrix::Q8)
        }
        WeightFormat::Q4 if values.shape == [rows, cols / 2] => {
            Q4Matrix::from_parts(rows, cols, bytes.to_vec(), sc).map(PackedMatrix::Q4)
        }
        _ => {
            return Err(format!(
                "`{name}.{format}` has shape {:?} for a ({rows}, {cols}) matrix",
                values.shape
            ))
        }
    };
    checked.map_err(|e| format!("`{name}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn layout_versions_and_formats_are_checked() {
        let meta = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(check_metadata(None).is_ok());
        assert!(check_metadata(Some(&meta(&[("format", "pt")]))).is_ok());
        let good = meta(&[(WEIGHTS_KEY, "q4"), (LAYOUT_VERSION_KEY, LAYOUT_VERSION)]);
        assert!(check_metadata(Some(&good)).is_ok());
        for (pairs, want) in [
            (
                vec![(WEIGHTS_KEY, "q4"), (LAYOUT_VERSION_KEY, "2")],
                "version `2` is not supported",
            ),
            (vec![(WEIGHTS_KEY, "q4")], "is missing"),
            (
                vec![(WEIGHTS_KEY, "q3"), (LAYOUT_VERSION_KEY, LAYOUT_VERSION)],
                "expected bf16, f16, q8 or q4",
            ),
            (
                vec![(WEIGHTS_KEY, "f32"), (LAYOUT_VERSION_KEY, LAYOUT_VERSION)],
                "expected bf16",
            ),
        ] {
            let e = check_metadata(Some(&meta(&pairs))).unwrap_err();
            assert!(e.contains(want), "{e}");
        }
    }
}
