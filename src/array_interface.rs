//! An exporter's description of an array as an `ArrayView`: the array interface's `typestr`,
//! shape and optional byte strides, or `DLPack`'s dtype (code, bits, lanes), shape, strides in
//! elements and byte offset. Only the numbers an exporter hands over are read, never memory;
//! every one of them is checked, so any values give a view or a refusal.

use crate::array_layout::ArrayView;
use crate::error::{bail, quoted, PlanError, PlanResult};
use crate::limits;

/// Bytes of an element of a typestr (`<f2`, `|u1`, `<V2`), or why it has no known size.
pub fn typestr_bytes(typestr: &str) -> PlanResult<u64> {
    let mut chars = typestr.chars();
    let (order, kind) = (chars.next(), chars.next());
    let size = chars.as_str().parse::<u64>().ok();
    match (order, kind, size) {
        (Some('<' | '>' | '|' | '='), Some('b' | 'i' | 'u' | 'f' | 'c' | 'V'), Some(n))
            if n > 0 && n <= limits::MAX_VALUE =>
        {
            Ok(n)
        }
        _ => bail!(
            "the array's dtype {} has no size pdplan knows; pass a view of a numeric or \
             raw-byte dtype",
            quoted(typestr)
        ),
    }
}

/// Row-major byte strides of `shape`, for an interface without strides.
pub fn compact_strides(shape: &[i64], itemsize: u64) -> PlanResult<Vec<i64>> {
    let mut strides = vec![0i64; shape.len()];
    let mut step = i64::try_from(itemsize)
        .map_err(|_| PlanError::new("the array's element size overflows 64 bits"))?;
    for (stride, &extent) in strides.iter_mut().zip(shape).rev() {
        *stride = step;
        step = step
            .checked_mul(extent.max(1))
            .ok_or_else(|| PlanError::new("the array's extent overflows 64 bits"))?;
    }
    Ok(strides)
}

/// The view an array interface (`__array_interface__`, `__cuda_array_interface__`)
/// describes: `strides` in bytes, or `None` for a row-major array.
pub fn interface_view(
    data: u64,
    shape: &[i64],
    strides: Option<Vec<i64>>,
    typestr: &str,
) -> PlanResult<ArrayView> {
    check_dimensions("the array's", shape.len())?;
    let itemsize = typestr_bytes(typestr)?;
    let strides = match strides {
        Some(strides) => strides,
        None => compact_strides(shape, itemsize)?,
    };
    view(data, shape, strides, itemsize)
}

/// A `DLPack` tensor's dtype, as its `DLDataType` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DlDtype {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// The view a `DLPack` tensor describes: `strides` in elements (`None`: row-major), its data
/// pointer plus `byte_offset` the address of element 0.
pub fn dlpack_view(
    data: u64,
    byte_offset: u64,
    shape: &[i64],
    strides: Option<&[i64]>,
    dtype: DlDtype,
) -> PlanResult<ArrayView> {
    check_dimensions("the DLPack tensor's", shape.len())?;
    if dtype.bits == 0 || dtype.bits % 8 != 0 || dtype.lanes == 0 {
        bail!(
            "the DLPack dtype (code {}, {} bits, {} lanes) has no whole byte size",
            dtype.code,
            dtype.bits,
            dtype.lanes
        );
    }
    let itemsize = u64::from(dtype.bits / 8) * u64::from(dtype.lanes);
    let strides = match strides {
        None => compact_strides(shape, itemsize)?,
        Some(elements) => {
            if elements.len() != shape.len() {
                bail!(
                    "the DLPack tensor has {} strides for {} dimensions",
                    elements.len(),
                    shape.len()
                );
            }
            let size = i64::try_from(itemsize).unwrap_or(i64::MAX);
            elements
                .iter()
                .map(|&s| {
                    s.checked_mul(size)
                        .ok_or_else(|| PlanError::new("a DLPack stride overflows 64 bits"))
                })
                .collect::<PlanResult<Vec<i64>>>()?
        }
    };
    let address = data
        .checked_add(byte_offset)
        .ok_or_else(|| PlanError::new("the DLPack address plus its byte offset overflows"))?;
    view(address, shape, strides, itemsize)
}

fn check_dimensions(whose: &str, ndim: usize) -> PlanResult<()> {
    limits::ARRAY_AXES
        .check(&format!("{whose} dimensions"), ndim as u64)
        .map(drop)
}

fn view(data: u64, shape: &[i64], strides: Vec<i64>, itemsize: u64) -> PlanResult<ArrayView> {
    if strides.len() != shape.len() {
        bail!(
            "the array has {} strides for {} dimensions",
            strides.len(),
            shape.len()
        );
    }
    let shape = shape
        .iter()
        .map(|&n| u64::try_from(n).map_err(|_| PlanError::new("the array's shape is negative")))
        .collect::<PlanResult<Vec<u64>>>()?;
    Ok(ArrayView {
        data,
        shape,
        strides,
        itemsize,
    })
}

#[cfg(test)]
mod tests {
    use super::{dlpack_view, interface_view, typestr_bytes, DlDtype};

    #[test]
    fn typestrs_give_their_sizes_or_a_refusal() {
        assert_eq!(typestr_bytes("<f2"), Ok(2));
        assert_eq!(typestr_bytes("|V656"), Ok(656));
        for bad in ["", "<", "<f", "<f0", "Xf2", "<O8", "<f99999999999999999999"] {
            assert!(typestr_bytes(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn views_check_their_numbers() {
        let v = interface_view(4096, &[2, 3], None, "<u2").expect("a view");
        assert_eq!(v.strides, vec![6, 2]);
        assert!(interface_view(0, &[2, -1], None, "<u2").is_err());
        assert!(interface_view(0, &[2, 3], Some(vec![1]), "<u2").is_err());
        assert!(interface_view(0, &[i64::MAX, i64::MAX], None, "<u8").is_err());
        let f16 = DlDtype {
            code: 2,
            bits: 16,
            lanes: 1,
        };
        let d = dlpack_view(100, 28, &[4, 5], Some(&[5, 1]), f16).expect("a view");
        assert_eq!((d.data, d.strides.clone()), (128, vec![10, 2]));
        assert!(dlpack_view(u64::MAX, 1, &[1], None, f16).is_err());
        assert!(dlpack_view(0, 0, &[1], None, DlDtype { bits: 4, ..f16 }).is_err());
        assert!(dlpack_view(0, 0, &[1], Some(&[i64::MAX]), f16).is_err());
    }
}
