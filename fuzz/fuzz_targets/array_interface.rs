//! An exporter's array metadata (the array interface's typestr, shape and strides; `DLPack`'s
//! dtype, shape, strides in elements and byte offset) with any axis names: a view and a
//! buffer, or a refusal, never a panic. A buffer pdplan accepts lies inside the bytes the
//! array spans (computed here from its shape and strides), and its layout is valid.
#![no_main]

#[allow(dead_code)] // only the input reader; this target builds no descriptors
mod common;

use common::Input;
use libfuzzer_sys::fuzz_target;
use pdplan::array_interface::{dlpack_view, interface_view, DlDtype};
use pdplan::array_layout::{buffer_from_array, ArraySpec, ArrayView, Axis};
use pdplan::layout::{BufferKind, LogicalParts};

const AXES: [Axis; 7] = [
    Axis::Page,
    Axis::Slot,
    Axis::Token,
    Axis::Row,
    Axis::Unit,
    Axis::Plane,
    Axis::Dim,
];
const TYPESTRS: [&str; 8] = ["<f2", "|u1", "<V2", "<f4", "|V656", "<i8", "<O8", "<f"];

/// A small signed value, sometimes a huge one (the edges must refuse, not overflow).
fn signed(input: &mut Input<'_>) -> i64 {
    #[allow(clippy::cast_possible_wrap)] // any bits: an exporter's numbers are any numbers
    match input.int(1) % 8 {
        0 => input.int(8) as i64,
        1 => -(input.int(1) as i64),
        _ => input.int(1) as i64 % 80,
    }
}

/// Bytes the view spans: from its lowest to one past its highest element (`None`: empty).
fn span(view: &ArrayView) -> Option<(i128, i128)> {
    if view.shape.contains(&0) {
        return None;
    }
    let (mut low, mut high) = (i128::from(view.data), i128::from(view.data));
    for (&extent, &stride) in view.shape.iter().zip(&view.strides) {
        let reach = i128::from(stride) * (i128::from(extent) - 1);
        if reach < 0 {
            low += reach;
        } else {
            high += reach;
        }
    }
    Some((low, high + i128::from(view.itemsize)))
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let ndim = usize::try_from(input.int(1) % 10).unwrap_or(0);
    let shape: Vec<i64> = (0..ndim).map(|_| signed(&mut input)).collect();
    let with_strides = input.int(1) % 2 == 0;
    let strides: Vec<i64> = (0..ndim).map(|_| signed(&mut input)).collect();
    let address = input.int(8) % (1 << 48);
    let view = if input.int(1) % 2 == 0 {
        let typestr = TYPESTRS[usize::try_from(input.int(1)).unwrap_or(0) % TYPESTRS.len()];
        interface_view(address, &shape, with_strides.then(|| strides.clone()), typestr)
    } else {
        let dtype = DlDtype {
            code: u8::try_from(input.int(1) % 4).unwrap_or(0),
            bits: u8::try_from(input.int(1)).unwrap_or(16),
            lanes: u16::try_from(input.int(1) % 3).unwrap_or(1),
        };
        dlpack_view(address, input.int(2), &shape, with_strides.then_some(&strides[..]), dtype)
    };
    let Ok(view) = view else { return };
    let axes: Vec<Axis> = (0..view.shape.len() + usize::from(input.int(1) % 4 == 0))
        .map(|_| AXES[usize::try_from(input.int(1)).unwrap_or(0) % AXES.len()])
        .collect();
    let spec = ArraySpec {
        buffer_index: input.int(1),
        buffer_kind: if input.int(1) % 4 == 0 {
            BufferKind::MambaState
        } else {
            BufferKind::TargetK
        },
        logical_size: (input.int(1) % 2 == 0).then(|| input.int(1) % 17),
        tp_size: input.int(1) % 5,
        page_size: (input.int(1) % 2 == 0).then(|| input.int(1) % 70),
        layer: None,
        sliding_window: None,
        attention_chunk_size: None,
        logical_parts: LogicalParts::WHOLE,
    };
    if let Ok(buffer) = buffer_from_array(&view, &axes, &spec) {
        buffer.layout.validate().expect("an accepted buffer is valid");
        let (low, high) = span(&view).expect("an accepted array holds elements");
        let (base, limit) = (i128::from(buffer.base), i128::from(buffer.limit));
        assert!(base >= low && base + limit <= high, "the buffer lies outside its array");
    }
});
