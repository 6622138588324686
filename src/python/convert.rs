//! Python objects -> validated core values. Every failure is a `PlanError` naming the field.

use numpy::{PyArray1, PyArrayDescrMethods, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyBytes, PyInt, PyString};

use super::fragment_slots::{SlotLayout, SlotRead};
use super::objects::{field_names, ModelTypes};
use crate::context::{CpKv, CpSplit};
use crate::descriptors::Buffers;
use crate::error::{bail, PlanError, QUOTED_CHARS};
use crate::fragment::{Field, FieldKind, FieldValue, Fragment, FIELDS, FIELD_COUNT, SETTERS};
use crate::layout::{
    BufferKind, BufferLayout, ContextParallel, LogicalAxis, LogicalParts, ParallelLayout, Role,
    TokenPieces,
};
use crate::limits::{self, Limit, MAX_VALUE};
use crate::model::{
    described_once, kind_of, DraftShape, Dtype, ItemLengths, KindType, KindValue, Layer, MlaShape,
    ModelShape,
};
use crate::wire;

pub type Converted<T> = Result<T, PlanError>;

/// Items `each` reserves room for before reading them.
const RESERVE_AT_MOST: usize = 1 << 16;

pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map_or_else(|_| "an unknown type".to_owned(), |n| n.to_string())
}

/// `obj`'s repr for a message, cut to its first `QUOTED_CHARS` characters when longer (a
/// caller's 1 MiB string makes no 1 MiB message); an int too long to print (Python refuses
/// past 4,300 digits) is named by its size.
pub fn repr(obj: &Bound<'_, PyAny>) -> String {
    let is_int = obj.is_instance_of::<PyInt>() && !obj.is_instance_of::<PyBool>();
    let Ok(shown) = obj.repr().map(|r| r.to_string()) else {
        if !is_int {
            return "?".to_owned();
        }
        let bits: u64 = obj
            .call_method0("bit_length")
            .and_then(|b| b.extract())
            .unwrap_or(0);
        let sign = if obj.lt(0).unwrap_or(false) { "-" } else { "" };
        return format!(
            "{sign}2^{} or so (an int of {bits} bits)",
            bits.saturating_sub(1)
        );
    };
    match shown.char_indices().nth(QUOTED_CHARS) {
        None => shown,
        Some((end, _)) => {
            let what = if is_int { "digits" } else { "characters" };
            let count = shown.chars().count() - usize::from(shown.starts_with('-'));
            format!("{}... ({count} {what})", &shown[..end])
        }
    }
}

/// A Python int (not a bool) in [0, 2^63).
pub fn to_u64(value: &Bound<'_, PyAny>, name: &str) -> Converted<u64> {
    as_u64(value).ok_or_else(|| not_an_index(value, name))
}

/// An optional non-negative integer argument: `None` (or left out) is `None`.
pub fn optional_u64(value: Option<&Bound<'_, PyAny>>, name: &str) -> Converted<Option<u64>> {
    value
        .filter(|v| !v.is_none())
        .map(|v| to_u64(v, name))
        .transpose()
}

/// A Python `str` (or `str` enum member), for the core to parse; only the type is judged here.
pub fn string_arg(value: &Bound<'_, PyAny>, name: &str) -> Converted<String> {
    value
        .extract::<String>()
        .map_err(|_| PlanError::new(format!("{name} must be a str, got {}", type_name(value))))
}

/// One side's buffers: base pointers and, when given (not `None`), their limits.
pub fn buffers(
    bases: &Bound<'_, PyAny>,
    limits: Option<&Bound<'_, PyAny>>,
    side: &str,
) -> Converted<Buffers> {
    let (bases_name, limits_name) = if side == "src" {
        ("src_base_ptrs", "src_limits")
    } else {
        ("dst_base_ptrs", "dst_limits")
    };
    Ok(Buffers {
        bases: buffer_column(bases, bases_name)?,
        limits: limits
            .filter(|l| !l.is_none())
            .map(|l| buffer_column(l, limits_name))
            .transpose()?,
    })
}

/// Any Python int (not a bool) of up to 128 bits, for the core to check; past that it is
/// refused here.
pub fn int_arg(value: &Bound<'_, PyAny>, name: &str) -> Converted<i128> {
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        bail!("{name} must be an int, got {}", type_name(value));
    }
    // Past 128 bits no range the core checks holds it: refused here, naming it as given.
    value.extract::<i128>().map_err(|_| {
        PlanError::new(format!(
            "{name}={} is out of range: it must be an integer in [0, 2^63)",
            repr(value)
        ))
    })
}

fn as_u64(value: &Bound<'_, PyAny>) -> Option<u64> {
    if value.is_instance_of::<PyBool>() {
        return None;
    }
    value.extract::<u64>().ok().filter(|n| *n <= MAX_VALUE)
}

fn not_an_index(value: &Bound<'_, PyAny>, name: &str) -> PlanError {
    PlanError::new(format!(
        "{name} must be an integer in [0, 2^63), got {} ({})",
        repr(value),
        type_name(value)
    ))
}

/// Reads the fields of a value through attributes with interned names (one cached type lookup
/// and one instance lookup a field, no string made per read), so duck-typed objects work too.
struct Fields<'a, 'py> {
    obj: &'a Bound<'py, PyAny>,
}

/// An interned attribute name: `intern!` caches one Python string per call site.
macro_rules! name {
    ($fields:expr, $name:literal) => {
        pyo3::intern!($fields.obj.py(), $name)
    };
}

impl<'py> Fields<'_, 'py> {
    fn get(&self, name: &Bound<'py, PyString>) -> Converted<Bound<'py, PyAny>> {
        self.obj.getattr(name).map_err(|_| {
            PlanError::new(format!(
                "expected an object with a {:?} field, got {}",
                name.to_string(),
                type_name(self.obj)
            ))
        })
    }

    fn u64(&self, name: &Bound<'py, PyString>) -> Converted<u64> {
        let value = self.get(name)?;
        // The name is only turned into a Rust string on the error path.
        as_u64(&value).ok_or_else(|| not_an_index(&value, &name.to_string()))
    }

    /// A field added after the reference's: objects that predate it (duck-typed layouts
    /// written for the reference) get its default.
    fn optional(&self, name: &Bound<'py, PyString>) -> Option<Bound<'py, PyAny>> {
        self.obj.getattr(name).ok().filter(|v| !v.is_none())
    }

    fn u64_or(&self, name: &Bound<'py, PyString>, default: u64) -> Converted<u64> {
        match self.optional(name) {
            None => Ok(default),
            Some(value) => as_u64(&value).ok_or_else(|| not_an_index(&value, &name.to_string())),
        }
    }

    /// A short list of counts (parts, their groups, token pieces), `None` where absent.
    fn counts(&self, name: &str) -> Converted<Option<Vec<u64>>> {
        let py = self.obj.py();
        self.optional(&PyString::new(py, name))
            .map(|value| each(&value, name, &limits::PARTS, |v| to_u64(v, name)))
            .transpose()
    }

    fn parts(&self) -> Converted<LogicalParts> {
        match (
            self.counts("logical_parts")?,
            self.counts("logical_part_groups")?,
        ) {
            (None, None) => Ok(LogicalParts::WHOLE),
            (None, Some(_)) => bail!("logical_part_groups names the groups of logical_parts"),
            (Some(sizes), None) => LogicalParts::new(&sizes),
            (Some(sizes), Some(groups)) => LogicalParts::new(&sizes)?.with_groups(&groups),
        }
    }

    fn string(&self, name: &Bound<'py, PyString>) -> Converted<String> {
        let value = self.get(name)?;
        // Members of `str` enums extract as their value.
        value.extract::<String>().map_err(|_| {
            PlanError::new(format!(
                "{name} must be a string, got {} ({})",
                repr(&value),
                type_name(&value)
            ))
        })
    }

    /// An optional string field: its default when absent or None.
    fn string_or(&self, name: &Bound<'py, PyString>, default: &str) -> Converted<String> {
        if self.optional(name).is_none() {
            return Ok(default.to_owned());
        }
        self.string(name)
    }

    fn kind(&self, types: Option<&ModelTypes>) -> Converted<BufferKind> {
        let value = self.get(name!(self, "buffer_kind"))?;
        kind_value(&value, types)
    }
}

/// A `BufferKind` member (by identity, the fast case) or its name.
fn kind_value(value: &Bound<'_, PyAny>, types: Option<&ModelTypes>) -> Converted<BufferKind> {
    if let Some(kind) = types.and_then(|t| t.kind_of(value)) {
        return Ok(kind);
    }
    // Members of `str` enums extract as their value.
    let text = value.extract::<String>().map_err(|_| {
        PlanError::new(format!(
            "buffer_kind must be a string, got {} ({})",
            repr(value),
            type_name(value)
        ))
    })?;
    BufferKind::parse(&text)
}

pub fn parallel_layout(obj: &Bound<'_, PyAny>) -> Converted<ParallelLayout> {
    let f = Fields { obj };
    let partition = f
        .optional(name!(f, "pp_layer_partition"))
        .map(|v| {
            each(&v, "pp_layer_partition", &limits::STAGES, |x| {
                to_u64(x, "pp_layer_partition item")
            })
        })
        .transpose()?;
    let context = ContextParallel {
        cp_size: f.u64_or(name!(f, "cp_size"), 1)?,
        dcp_size: f.u64_or(name!(f, "dcp_size"), 1)?,
        kv: CpKv::parse(&f.string_or(name!(f, "cp_kv"), "sharded")?)?,
        split: CpSplit::parse(&f.string_or(name!(f, "cp_split"), "interleave")?)?,
        interleave: f.u64_or(name!(f, "cp_interleave"), 1)?,
    };
    ParallelLayout::with_context(
        Role::parse(&f.string(name!(f, "role"))?)?,
        (
            f.u64(name!(f, "world_size"))?,
            f.u64(name!(f, "dp_size"))?,
            f.u64_or(name!(f, "pp_size"), 1)?,
        ),
        partition,
        context,
    )
}

pub fn buffer_layout(obj: &Bound<'_, PyAny>) -> Converted<BufferLayout> {
    let f = Fields { obj };
    let buffer = BufferLayout {
        buffer_index: f.u64(name!(f, "buffer_index"))?,
        buffer_kind: f.kind(None)?,
        logical_axis: LogicalAxis::parse(&f.string(name!(f, "logical_axis"))?)?,
        logical_size: f.u64(name!(f, "logical_size"))?,
        page_size: f.u64(name!(f, "page_size"))?,
        bytes_per_logical_unit: f.u64(name!(f, "bytes_per_logical_unit"))?,
        item_stride_bytes: f.u64(name!(f, "item_stride_bytes"))?,
        tp_replica_group_size: f.u64(name!(f, "tp_replica_group_size"))?,
        layer: f
            .optional(name!(f, "layer"))
            .map(|v| to_u64(&v, "layer"))
            .transpose()?,
        rows_per_page: f.u64_or(name!(f, "rows_per_page"), 1)?,
        page_bytes: f
            .optional(name!(f, "page_bytes"))
            .map(|v| to_u64(&v, "page_bytes"))
            .transpose()?,
        logical_parts: f.parts()?,
        sliding_window: f
            .optional(name!(f, "sliding_window"))
            .map(|v| to_u64(&v, "sliding_window"))
            .transpose()?,
        attention_chunk_size: f
            .optional(name!(f, "attention_chunk_size"))
            .map(|v| to_u64(&v, "attention_chunk_size"))
            .transpose()?,
        token_pieces: f
            .counts("token_pieces")?
            .map_or(Ok(TokenPieces::NONE), |pieces| TokenPieces::new(&pieces))?,
    };
    buffer.validate()?;
    Ok(buffer)
}

/// A fragment from a `TransferFragment` or any object with its fields, read field by field as
/// the schema says: the reference's (version 1) fields are required attributes; later ones
/// may be missing or `None` (objects written for the reference) and then take their defaults.
/// `types` enables the identity fast path for `BufferKind` members.
pub fn fragment_with(obj: &Bound<'_, PyAny>, types: Option<&ModelTypes>) -> Converted<Fragment> {
    FragmentReader::new(types).read(obj)
}

/// A sequence of fragments (`what` names it in errors), read by one `FragmentReader`.
pub fn fragments_of(
    items: &Bound<'_, PyAny>,
    what: &str,
    types: &ModelTypes,
) -> Converted<Vec<Fragment>> {
    let mut reader = FragmentReader::new(Some(types));
    each(items, what, &limits::PLAN_FRAGMENTS, |f| reader.read(f))
}

/// Reads many fragments in one call. A `TransferFragment` is read from its slots (see
/// `fragment_slots`) starting from the previous one read so: a field still holding the same
/// immutable object (an int, `None`, a `BufferKind` member) keeps its value, which the
/// reader knows because it keeps that object alive (fragments of a list share most of their
/// values). Anything else is read through its attributes.
pub struct FragmentReader<'a, 'py> {
    types: Option<&'a ModelTypes>,
    /// The previous fragment read from slots, and per field the immutable object it held.
    previous: Option<(Fragment, [Option<Bound<'py, PyAny>>; FIELD_COUNT])>,
}

impl<'a, 'py> FragmentReader<'a, 'py> {
    pub fn new(types: Option<&'a ModelTypes>) -> Self {
        Self {
            types,
            previous: None,
        }
    }

    pub fn read(&mut self, obj: &Bound<'py, PyAny>) -> Converted<Fragment> {
        if let Some(slots) = self.types.and_then(|t| t.fragment_slots.as_ref()) {
            if let Some(read) = self.read_slots(slots, obj) {
                return read;
            }
        }
        self.read_attributes(obj)
    }

    /// `obj` read from its slots, or `None` when it is not exactly a `TransferFragment` with
    /// every field set (the attribute path then reads it, or says what is missing).
    fn read_slots(
        &mut self,
        slots: &SlotLayout,
        obj: &Bound<'py, PyAny>,
    ) -> Option<Converted<Fragment>> {
        if !slots.holds(obj) {
            return None;
        }
        let types = self.types;
        // Updated in place (a fragment and its objects are hundreds of bytes to move); a
        // refusal forgets it.
        let (fragment, known) = self
            .previous
            .get_or_insert_with(|| (Fragment::default(), std::array::from_fn(|_| None)));
        for (index, (field, slot)) in FIELDS.iter().zip(known.iter_mut()).enumerate() {
            let given = match slots.field(obj, index, slot.as_ref()) {
                SlotRead::Known => continue,
                SlotRead::Value(value) => value,
                SlotRead::Unread => {
                    self.previous = None;
                    return None;
                }
            };
            match field_value(types, field, &given) {
                Ok(value) => {
                    if let Some(set) = SETTERS.get(index) {
                        set(fragment, value);
                    }
                }
                Err(error) => {
                    self.previous = None;
                    return Some(Err(error));
                }
            }
            *slot = is_immutable(types, &given).then_some(given);
        }
        let read = *fragment;
        if let Err(error) = read.validate() {
            self.previous = None;
            return Some(Err(error));
        }
        Some(Ok(read))
    }

    fn read_attributes(&self, obj: &Bound<'py, PyAny>) -> Converted<Fragment> {
        // Fields not given (later ones, on objects that predate them) keep their defaults.
        let mut fragment = Fragment::default();
        let f = Fields { obj };
        let names = field_names(obj.py());
        for ((field, set), name) in FIELDS.iter().zip(SETTERS).zip(names) {
            let name = name.bind(obj.py());
            let given = if field.since == wire::PROTOCOL_VERSION {
                f.get(name)?
            } else {
                match obj.getattr(name) {
                    Ok(value) => value,
                    Err(_) => continue,
                }
            };
            set(&mut fragment, field_value(self.types, field, &given)?);
        }
        fragment.validate()?;
        Ok(fragment)
    }
}

/// A field's value from the object it holds. A field added after the reference's holding
/// `None` (an object that predates it) takes its default.
fn field_value(
    types: Option<&ModelTypes>,
    field: &Field,
    given: &Bound<'_, PyAny>,
) -> Converted<FieldValue> {
    if field.since != wire::PROTOCOL_VERSION && given.is_none() {
        if let Some(default) = field.default {
            return Ok(default);
        }
    }
    Ok(match field.kind {
        FieldKind::Int => FieldValue::Int(to_u64(given, field.name)?),
        FieldKind::OptionalInt if given.is_none() => FieldValue::OptionalInt(None),
        FieldKind::OptionalInt => FieldValue::OptionalInt(Some(to_u64(given, field.name)?)),
        FieldKind::Kind => FieldValue::Kind(kind_value(given, types)?),
    })
}

/// Whether `value` reads the same every time: an object with `__index__` may not.
fn is_immutable(types: Option<&ModelTypes>, value: &Bound<'_, PyAny>) -> bool {
    value.is_exact_instance_of::<PyInt>()
        || value.is_none()
        || types.is_some_and(|t| t.kind_of(value).is_some())
}

/// A `ModelShape`: its layers (`layer_kinds`) or the uniform stack its flat fields describe,
/// its dtypes and its draft model (zero layers: none).
pub fn model_shape(obj: &Bound<'_, PyAny>) -> Converted<ModelShape> {
    let f = Fields { obj };
    let field = |name: &str| -> Converted<u64> {
        let value = obj.getattr(name).map_err(|_| {
            PlanError::new(format!(
                "expected a ModelShape with a {name:?} field, got {}",
                type_name(obj)
            ))
        })?;
        to_u64(&value, name)
    };
    let dtype = Dtype::parse(&f.string(name!(f, "dtype"))?)?;
    let page_size = field("page_size")?;
    let kinds = match f.optional(name!(f, "layer_kinds")) {
        Some(list) => each(&list, "layer_kinds", &limits::LAYERS, layer)?,
        None => Vec::new(),
    };
    let uniform = field("layers")?;
    described_once(uniform, kinds.len())?;
    let mut shape = if kinds.is_empty() {
        let mla = MlaShape {
            kv_lora_rank: field("mla_kv_lora_rank")?,
            rope_head_dim: field("mla_rope_head_dim")?,
            index_head_dim: 0,
        };
        let dims = (field("kv_heads")?, field("head_dim")?);
        ModelShape::uniform(
            uniform,
            dims,
            (mla.kv_lora_rank > 0).then_some(mla),
            dtype,
            page_size,
        )?
    } else {
        ModelShape {
            layers: kinds,
            dtype,
            kv_cache_dtype: None,
            state_dtype: None,
            page_size,
            draft: None,
            family: None,
        }
    };
    let optional_dtype = |name: &str| -> Converted<Option<Dtype>> {
        match obj.getattr(name).ok().filter(|v| !v.is_none()) {
            None => Ok(None),
            Some(value) => {
                let text = string_arg(&value, name)?;
                // vLLM's "auto": the model's dtype.
                if text == "auto" {
                    return Ok(None);
                }
                Dtype::parse(&text)
                    .map(Some)
                    .map_err(|e| PlanError::new(format!("{name}: {e}")))
            }
        }
    };
    shape.kv_cache_dtype = optional_dtype("kv_cache_dtype")?;
    shape.state_dtype = optional_dtype("state_dtype")?;
    let draft = DraftShape {
        layers: field("draft_layers")?,
        kv_heads: field("draft_kv_heads")?,
        head_dim: field("draft_head_dim")?,
    };
    shape.draft = (draft.layers > 0).then_some(draft);
    Ok(shape)
}

/// One layer object (`AttentionLayer`, `Mamba2Layer`, ...), by its `kind`.
pub fn layer(obj: &Bound<'_, PyAny>) -> Converted<Layer> {
    let f = Fields { obj };
    let kind = kind_of(&f.string(name!(f, "kind"))?)?;
    let name = kind.kind;
    let field = |field: &str| -> Converted<Bound<'_, PyAny>> {
        obj.getattr(field).map_err(|_| {
            PlanError::new(format!(
                "a {name} layer needs a {field:?} field, got {}",
                repr(obj)
            ))
        })
    };
    let mut values = Vec::with_capacity(kind.fields.len());
    for spec in kind.fields {
        values.push(match spec.ty {
            KindType::Int(_) => KindValue::Int(to_u64(&field(spec.name)?, spec.name)?),
            KindType::OptionalInt => {
                // A field that may be missing (layer objects written before it) or None.
                match obj.getattr(spec.name).ok().filter(|v| !v.is_none()) {
                    None => KindValue::OptionalInt(None),
                    Some(value) => KindValue::OptionalInt(Some(to_u64(&value, spec.name)?)),
                }
            }
            KindType::Layer(want) => {
                // A part's kind is checked before it is read, so an object that names itself
                // as its own part cannot recurse.
                let value = field(spec.name)?;
                let got = Fields { obj: &value }.string(pyo3::intern!(obj.py(), "kind"))?;
                if got != want {
                    bail!(
                        "the {} of a {name} layer must be a {want} layer, got {}",
                        spec.name,
                        repr(&value)
                    );
                }
                KindValue::Layer(layer(&value)?)
            }
        });
    }
    Layer::from_values(kind, values)
}

/// An `ItemLengths` entry.
pub fn item_lengths(obj: &Bound<'_, PyAny>) -> Converted<ItemLengths> {
    let f = Fields { obj };
    let logical = f.get(name!(f, "logical_size"))?;
    Ok(ItemLengths {
        buffer_index: f.u64(name!(f, "buffer_index"))?,
        buffer_kind: f.kind(None)?,
        prefill_item_bytes: f.u64(name!(f, "prefill_item_bytes"))?,
        decode_item_bytes: f.u64(name!(f, "decode_item_bytes"))?,
        unit_bytes: f.u64(name!(f, "unit_bytes"))?,
        page_size: f.u64(name!(f, "page_size"))?,
        logical_size: if logical.is_none() {
            None
        } else {
            Some(to_u64(&logical, "logical_size")?)
        },
        rows_per_page: f.u64_or(name!(f, "rows_per_page"), 1)?,
    })
}

/// Converts every item of a Python iterable, naming the position of the first bad one. At most
/// `bound.max` items are read: an endless iterable is refused by `bound`'s message, never read
/// without end.
pub fn each<'py, T>(
    items: &Bound<'py, PyAny>,
    what: &str,
    bound: &Limit,
    mut convert: impl FnMut(&Bound<'py, PyAny>) -> Converted<T>,
) -> Converted<Vec<T>> {
    let iter = items.try_iter().map_err(|_| {
        PlanError::new(format!(
            "{what} must be a sequence, got {}",
            type_name(items)
        ))
    })?;
    // Room for a sequence's items up front (bounded: a length is only a claim).
    let room = items.len().map_or(0, |len| len.min(RESERVE_AT_MOST));
    let mut out = Vec::with_capacity(room);
    for (position, item) in iter.enumerate() {
        check_count(bound, what, position)?;
        let item = item.map_err(|e| PlanError::new(format!("{what}: {e}")))?;
        let converted = convert(&item)
            .map_err(|e| PlanError::new(format!("{what}[{position}]: {}", e.message())))?;
        out.push(converted);
    }
    Ok(out)
}

/// Refuses reading item `position` (0-based) of `what` past `bound`.
fn check_count(bound: &Limit, what: &str, position: usize) -> Converted<()> {
    let count = position as u64 + 1;
    if count > bound.max {
        bound.check_advising(
            &format!("len({what})"),
            count,
            "an iterable is read up to the bound and refused past it",
        )?;
    }
    Ok(())
}

pub fn frame<'a>(value: &'a Bound<'_, PyAny>, name: &str) -> Converted<Option<&'a [u8]>> {
    if value.is_none() {
        return Ok(None);
    }
    value
        .cast::<PyBytes>()
        .map(|b| Some(b.as_bytes()))
        .map_err(|_| {
            PlanError::new(format!(
                "{name} must be bytes or None, got {}",
                type_name(value)
            ))
        })
}

/// The integers a column may hold: what a value must be, for the messages.
pub trait ColumnInt: numpy::Element + Copy + TryFrom<i128> {
    /// What every entry must be.
    const WHAT: &'static str;
    /// Why an integer of a numpy array does not fit.
    const MISFIT: &'static str;
    /// The numpy dtype kind of `T` itself: `b'i'` or `b'u'`.
    const KIND: u8;
}

impl ColumnInt for u64 {
    const WHAT: &'static str = "a non-negative integer below 2^64";
    const MISFIT: &'static str = "is negative";
    const KIND: u8 = b'u';
}

impl ColumnInt for i64 {
    const WHAT: &'static str = "an integer that fits 64 bits";
    const MISFIT: &'static str = "does not fit a signed 64-bit slot";
    const KIND: u8 = b'i';
}

/// Integers from a 1-D numpy integer array (any width, signed or not) or from a sequence of
/// Python ints, each checked to fit `T`.
fn int_column<T: ColumnInt>(
    obj: &Bound<'_, PyAny>,
    name: &str,
    bound: &Limit,
) -> Converted<Vec<T>> {
    if let Ok(array) = obj.cast::<PyUntypedArray>() {
        return array_column(array, name);
    }
    let iter = obj.try_iter().map_err(|_| {
        PlanError::new(format!(
            "{name} must be a 1-D integer numpy array or a sequence of ints, got {}",
            type_name(obj)
        ))
    })?;
    let mut out = Vec::new();
    for (i, item) in iter.enumerate() {
        check_count(bound, name, i)?;
        let item = item.map_err(|e| PlanError::new(format!("{name}: {e}")))?;
        let value = if item.is_instance_of::<PyBool>() {
            None
        } else {
            item.extract::<i128>()
                .ok()
                .and_then(|v| T::try_from(v).ok())
        };
        out.push(value.ok_or_else(|| {
            PlanError::new(format!(
                "{name}[{i}] must be {}, got {}",
                T::WHAT,
                repr(&item)
            ))
        })?);
    }
    Ok(out)
}

/// Integers from a numpy array, read as its dtype says: the dtype is looked at once, not tried
/// against every integer type in turn.
fn array_column<T: ColumnInt>(array: &Bound<'_, PyUntypedArray>, name: &str) -> Converted<Vec<T>> {
    let dtype = array.dtype();
    let (kind, width) = (dtype.kind(), dtype.itemsize());
    // A byte order other than the machine's is no integer type here (none matches it).
    let native = dtype.is_native_byteorder() != Some(false);
    // An array of `T` itself (what `token_slots` returns, base pointers as uint64): one copy.
    if native && kind == T::KIND && width == size_of::<T>() {
        if let Ok(same) = array.cast::<PyArray1<T>>() {
            let readonly = same
                .try_readonly()
                .map_err(|e| PlanError::new(format!("{name} cannot be read: {e}")))?;
            if let Ok(slice) = readonly.as_slice() {
                return Ok(slice.to_vec());
            }
        }
    }
    macro_rules! typed {
        ($($t:ty),*) => {$(
            let signed = <$t>::MIN != 0;
            let matches = kind == if signed { b'i' } else { b'u' } && width == size_of::<$t>();
            if native && matches {
                if let Ok(typed) = array.cast::<PyArray1<$t>>() {
                    let readonly = typed.try_readonly().map_err(|e| {
                        PlanError::new(format!("{name} cannot be read: {e}"))
                    })?;
                    let misfit = |(i, v): (usize, $t)| {
                        PlanError::new(format!("{name}[{i}] = {v} {}", T::MISFIT))
                    };
                    let convert = |(i, &v): (usize, &$t)| {
                        T::try_from(i128::from(v)).map_err(|_| misfit((i, v)))
                    };
                    // Contiguous arrays (the common case) convert as a plain slice.
                    if let Ok(slice) = readonly.as_slice() {
                        // A pass without error bookkeeping first (it vectorises); the error
                        // names the first misfit only when there is one.
                        let fitted: Option<Vec<T>> =
                            slice.iter().map(|&v| T::try_from(i128::from(v)).ok()).collect();
                        if let Some(values) = fitted {
                            return Ok(values);
                        }
                        return slice.iter().enumerate().map(convert).collect();
                    }
                    return readonly.as_array().iter().enumerate().map(convert).collect();
                }
            }
        )*};
    }
    typed!(i64, i32, u64, u32, i16, u16, i8, u8);
    bail!(
        "{name} must be a 1-D integer array, got a {}-D array of {}",
        array.ndim(),
        dtype
    )
}

/// Whether any value has its sign bit set: ORs of fixed-size chunks, which vectorise.
fn any_negative(values: &[i64]) -> bool {
    let mut chunks = values.chunks_exact(8);
    let mut any = chunks
        .by_ref()
        .fold([0i64; 8], |mut acc, c| {
            for (a, v) in acc.iter_mut().zip(c) {
                *a |= v;
            }
            acc
        })
        .iter()
        .fold(0, |acc, v| acc | v);
    any |= chunks.remainder().iter().fold(0, |acc, v| acc | v);
    any < 0
}

/// Non-negative integers of a request: page indices (a sequence is read to `MAX_TOKENS`
/// entries: a request has no more pages than tokens).
pub fn u64_column(obj: &Bound<'_, PyAny>, name: &str) -> Converted<Vec<u64>> {
    // Page tables mostly come as int64 (numpy's default): one check and one copy.
    if let Ok(array) = obj.cast::<PyArray1<i64>>() {
        if let Ok(readonly) = array.try_readonly() {
            if let Ok(slice) = readonly.as_slice() {
                if !any_negative(slice) {
                    // Every value is non-negative, so the cast keeps it (and vectorises).
                    #[allow(clippy::cast_sign_loss)]
                    return Ok(slice.iter().map(|&v| v as u64).collect());
                }
            }
        }
    }
    int_column(obj, name, &limits::TOKENS)
}

/// Non-negative integers of a side's buffers: base addresses, limits, buffer indexes (read to
/// `MAX_LAYOUT_BUFFERS` entries).
pub fn buffer_column(obj: &Bound<'_, PyAny>, name: &str) -> Converted<Vec<u64>> {
    int_column(obj, name, &limits::LAYOUT_BUFFERS)
}

/// Signed integers: slot maps and page tables, where -1 marks what a rank does not hold (read
/// to `MAX_TOKENS` entries).
pub fn i64_column(obj: &Bound<'_, PyAny>, name: &str) -> Converted<Vec<i64>> {
    int_column(obj, name, &limits::TOKENS)
}
