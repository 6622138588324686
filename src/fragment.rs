//! One transfer fragment: a byte range of every page of one buffer, from one prefill rank to
//! one decode rank, or for token-major pages one run per row. The unit the plan, the wire
//! format and descriptor building share, and its schema: the one table the struct, the wire
//! keys of each version, the Python objects and validation are all derived from.

use crate::error::{bail, PlanResult};
use crate::layout::BufferKind;
use crate::limits::{self, MAX_VALUE};
use crate::page::{RowRuns, TokenRuns, TokenSpan};

/// What a field holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldKind {
    /// An integer in [0, 2^63).
    Int,
    /// `None` or an integer in [0, 2^63).
    OptionalInt,
    /// A buffer kind, by name.
    Kind,
}

/// One field's value, whatever its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldValue {
    Int(u64),
    OptionalInt(Option<u64>),
    Kind(BufferKind),
}

/// One row of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub kind: FieldKind,
    /// The first wire version that carries the field: earlier versions neither write nor
    /// accept it, and a list whose fragments all hold its default is written in an earlier one.
    pub since: u32,
    /// The value a fragment holds when the field is not given; `None`: the field is required.
    pub default: Option<FieldValue>,
}

/// The Rust types fields may have.
pub trait FieldType: Sized + Default {
    const KIND: FieldKind;
    fn into_value(self) -> FieldValue;
    fn from_value(value: FieldValue) -> Option<Self>;
    /// The integer the field holds (0 for none), for the one-test range check.
    fn int_bits(&self) -> u64;
    /// The field's value as the wire's JSON writes it.
    fn write_json(&self, out: &mut String, digits: &mut itoa::Buffer);
}

impl FieldType for u64 {
    const KIND: FieldKind = FieldKind::Int;
    fn into_value(self) -> FieldValue {
        FieldValue::Int(self)
    }
    fn int_bits(&self) -> u64 {
        *self
    }
    fn write_json(&self, out: &mut String, digits: &mut itoa::Buffer) {
        out.push_str(digits.format(*self));
    }
    fn from_value(value: FieldValue) -> Option<Self> {
        match value {
            FieldValue::Int(v) => Some(v),
            _ => None,
        }
    }
}

impl FieldType for Option<u64> {
    const KIND: FieldKind = FieldKind::OptionalInt;
    fn into_value(self) -> FieldValue {
        FieldValue::OptionalInt(self)
    }
    fn int_bits(&self) -> u64 {
        self.unwrap_or(0)
    }
    fn write_json(&self, out: &mut String, digits: &mut itoa::Buffer) {
        match self {
            Some(value) => out.push_str(digits.format(*value)),
            None => out.push_str("null"),
        }
    }
    fn from_value(value: FieldValue) -> Option<Self> {
        match value {
            FieldValue::OptionalInt(v) => Some(v),
            _ => None,
        }
    }
}

impl FieldType for BufferKind {
    const KIND: FieldKind = FieldKind::Kind;
    fn into_value(self) -> FieldValue {
        FieldValue::Kind(self)
    }
    fn int_bits(&self) -> u64 {
        0
    }
    fn write_json(&self, out: &mut String, _digits: &mut itoa::Buffer) {
        out.push('"');
        out.push_str(self.as_str());
        out.push('"');
    }
    fn from_value(value: FieldValue) -> Option<Self> {
        match value {
            FieldValue::Kind(v) => Some(v),
            _ => None,
        }
    }
}

/// Defines `Fragment`, `FIELDS` and the conversions between the two from one table.
macro_rules! fragment_schema {
    ($($(#[doc = $doc:literal])* $name:ident: $ty:ty, since $since:literal $(, default $default:expr)?;)*) => {
        /// One transfer fragment; its fields, in order, are the schema's rows.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct Fragment {
            $($(#[doc = $doc])* pub $name: $ty,)*
        }

        /// How many fields a fragment has.
        pub const FIELD_COUNT: usize = [$(stringify!($name)),*].len();

        /// The schema, in field order: the struct, the dataclass, the wire keys.
        pub const FIELDS: [Field; FIELD_COUNT] = [$(Field {
            name: stringify!($name),
            kind: <$ty as FieldType>::KIND,
            since: $since,
            default: fragment_schema!(@default $($default)?),
        }),*];

        /// Per field, in schema order: stores a value of the field's kind (false for another
        /// kind), so a decoder fills a fragment field by field without naming them.
        pub const SETTERS: [fn(&mut Fragment, FieldValue) -> bool; FIELD_COUNT] = [$(
            |fragment, value| match <$ty as FieldType>::from_value(value) {
                Some(v) => {
                    fragment.$name = v;
                    true
                }
                None => false,
            }
        ),*];

        impl Fragment {
            /// Every field's value, in schema order.
            pub fn values(&self) -> [FieldValue; FIELD_COUNT] {
                [$(FieldType::into_value(self.$name)),*]
            }

            /// Field `index`'s value (schema order), if there is such a field.
            pub fn field_value(&self, index: usize) -> Option<FieldValue> {
                let mut field = 0;
                $(
                    if field == index {
                        return Some(FieldType::into_value(self.$name));
                    }
                    field += 1;
                )*
                let _ = field;
                None
            }

            /// A bit per field (schema order) whose value differs from `other`'s.
            pub fn differing_fields(&self, other: &Self) -> u64 {
                let mut bit = 1;
                let mut mask = 0;
                $(
                    if self.$name != other.$name {
                        mask |= bit;
                    }
                    bit <<= 1;
                )*
                let _ = bit;
                mask
            }

            /// Every integer field OR-ed together: below 2^63 exactly when each of them is.
            fn int_bits(&self) -> u64 {
                0 $(| FieldType::int_bits(&self.$name))*
            }

            /// The oldest wire version that carries this fragment: the newest `since` among
            /// the fields that differ from their defaults.
            pub fn wire_version(&self) -> u32 {
                let mut version = 1;
                $(
                    let default: Option<FieldValue> = fragment_schema!(@default $($default)?);
                    if default.is_some_and(|d| d != FieldType::into_value(self.$name)) {
                        version = version.max($since);
                    }
                )*
                version
            }

            /// The fragment as one JSON object of a version `version` frame: the fields that
            /// version carries, in schema order, written by hand (formatting machinery would
            /// be most of the cost).
            pub fn write_json(&self, out: &mut String, version: u32, digits: &mut itoa::Buffer) {
                out.push('{');
                let mut first = true;
                $(
                    if $since <= version {
                        let key = concat!(",\"", stringify!($name), "\":");
                        out.push_str(if first { &key[1..] } else { key });
                        first = false;
                        FieldType::write_json(&self.$name, out, digits);
                    }
                )*
                let _ = first;
                out.push('}');
            }
        }

        /// Every field at its default; required fields at 0 (and `target_k`). Fragments are
        /// built as `Fragment { required fields, ..Fragment::default() }`, so a field added
        /// with a default needs no other change.
        impl Default for Fragment {
            fn default() -> Self {
                Self {
                    $($name: fragment_schema!(@default $($default)?)
                        .and_then(<$ty as FieldType>::from_value)
                        .unwrap_or_default(),)*
                }
            }
        }
    };
    (@default) => { None };
    (@default $default:expr) => { Some($default) };
}

// The schema. To add a field with a default: add its row here (at the end, with the first wire
// version that carries it and its default) and the same field to `TransferFragment` in
// python/pdplan/_model.py; nothing else is edited by hand. Wire coding, the Python object
// factory and reader, validation and the parity tests all follow this table.
fragment_schema! {
    buffer_index: u64, since 1;
    buffer_kind: BufferKind, since 1;
    src_rank: u64, since 1;
    dst_rank: u64, since 1;
    src_page_stride_bytes: u64, since 1;
    dst_page_stride_bytes: u64, since 1;
    src_byte_offset: u64, since 1;
    dst_byte_offset: u64, since 1;
    bytes_per_page: u64, since 1;
    /// Limits the fragment to the first `page_count` pages of a request; `None` means all.
    page_count: Option<u64>, since 1, default FieldValue::OptionalInt(None);
    /// Runs a page: each page moves `rows_per_page` runs of `bytes_per_page / rows_per_page`
    /// bytes, run `r` at `offset + r * row_stride` on each side. 1 (strides 0) is one span.
    rows_per_page: u64, since 2, default FieldValue::Int(1);
    src_row_stride_bytes: u64, since 2, default FieldValue::Int(0);
    dst_row_stride_bytes: u64, since 2, default FieldValue::Int(0);
    /// Token geometry (slot maps): tokens a source page holds; 0, with every token field 0,
    /// for a fragment without it. Each token moves `token_runs` runs of `token_run_bytes`
    /// bytes, run `i` of slot `s` at `byte_offset + i * token_run_stride + s * token_stride`.
    src_page_size: u64, since 3, default FieldValue::Int(0);
    /// Tokens a destination page holds.
    dst_page_size: u64, since 3, default FieldValue::Int(0);
    token_runs: u64, since 3, default FieldValue::Int(0);
    token_run_bytes: u64, since 3, default FieldValue::Int(0);
    src_token_stride_bytes: u64, since 3, default FieldValue::Int(0);
    dst_token_stride_bytes: u64, since 3, default FieldValue::Int(0);
    src_token_run_stride_bytes: u64, since 3, default FieldValue::Int(0);
    dst_token_run_stride_bytes: u64, since 3, default FieldValue::Int(0);
    /// A sliding-window buffer's window (tokens): a request of `n` tokens moves only tokens
    /// `t >= n - sliding_window`. Needs token geometry; `None` moves every token.
    sliding_window: Option<u64>, since 4, default FieldValue::OptionalInt(None);
    /// A chunked local-attention buffer's chunk (tokens): a request of `n` tokens moves only
    /// tokens `t >= (n / attention_chunk_size) * attention_chunk_size`. Needs token geometry;
    /// `None` moves every token.
    attention_chunk_size: Option<u64>, since 5, default FieldValue::OptionalInt(None);
    /// 1: pages do not pair one to one though both sides' pages hold as many tokens (a
    /// head-major page facing a token-major one), so only slot maps move the fragment; the
    /// page fields say where its runs start, as where page sizes differ. Needs token geometry.
    pages_unpaired: u64, since 6, default FieldValue::Int(0);
}

/// The newest wire version a field needs.
pub const LATEST_VERSION: u32 = {
    let mut latest = 1;
    let mut i = 0;
    while i < FIELD_COUNT {
        if FIELDS[i].since > latest {
            latest = FIELDS[i].since;
        }
        i += 1;
    }
    latest
};

// Every field a later version adds has a default, so older frames still decode to fragments;
// and a decoder's bit set of the fields seen fits one u64.
const _: () = assert!(FIELD_COUNT <= 64);
const _: () = {
    let mut i = 0;
    while i < FIELD_COUNT {
        assert!(FIELDS[i].since == 1 || FIELDS[i].default.is_some());
        i += 1;
    }
};

impl Fragment {
    /// Whether the fragment moves more than one run a page (and so needs wire format v2).
    pub const fn is_row_fragment(&self) -> bool {
        self.rows_per_page != 1
    }

    /// Bytes of one run (a row's share of `bytes_per_page`).
    pub const fn run_bytes(&self) -> u64 {
        // `rows_per_page` is validated to be positive; 0 reads as no run at all.
        match self.bytes_per_page.checked_div(self.rows_per_page) {
            Some(run) => run,
            None => 0,
        }
    }

    /// The runs the fragment reads in a source page.
    pub const fn src_runs(&self) -> RowRuns {
        RowRuns {
            offset: self.src_byte_offset,
            rows: self.rows_per_page,
            row_stride: self.src_row_stride_bytes,
            run: self.run_bytes(),
        }
    }

    /// The runs the fragment writes in a destination page.
    pub const fn dst_runs(&self) -> RowRuns {
        RowRuns {
            offset: self.dst_byte_offset,
            rows: self.rows_per_page,
            row_stride: self.dst_row_stride_bytes,
            run: self.run_bytes(),
        }
    }

    /// The fragment's token geometry (`is_present()` false without it).
    pub const fn token_span(&self) -> TokenSpan {
        TokenSpan {
            src_page_size: self.src_page_size,
            dst_page_size: self.dst_page_size,
            runs: self.token_runs,
            run_bytes: self.token_run_bytes,
            src_token_stride: self.src_token_stride_bytes,
            dst_token_stride: self.dst_token_stride_bytes,
            src_run_stride: self.src_token_run_stride_bytes,
            dst_run_stride: self.dst_token_run_stride_bytes,
            pages_unpaired: self.pages_unpaired != 0,
        }
    }

    /// Sets the token geometry.
    #[must_use]
    pub const fn with_token_span(mut self, span: TokenSpan) -> Self {
        self.src_page_size = span.src_page_size;
        self.dst_page_size = span.dst_page_size;
        self.token_runs = span.runs;
        self.token_run_bytes = span.run_bytes;
        self.src_token_stride_bytes = span.src_token_stride;
        self.dst_token_stride_bytes = span.dst_token_stride;
        self.src_token_run_stride_bytes = span.src_run_stride;
        self.dst_token_run_stride_bytes = span.dst_run_stride;
        self.pages_unpaired = if span.pages_unpaired { 1 } else { 0 };
        self
    }

    /// Sets the sliding window (tokens), for a fragment with token geometry.
    #[must_use]
    pub const fn with_window(mut self, window: Option<u64>) -> Self {
        self.sliding_window = window;
        self
    }

    /// Sets the attention chunk (tokens), for a fragment with token geometry.
    #[must_use]
    pub const fn with_chunk(mut self, chunk: Option<u64>) -> Self {
        self.attention_chunk_size = chunk;
        self
    }

    /// Whether the fragment can only move by slot maps: its two sides' pages hold different
    /// token counts, or store them differently, so pages do not pair one to one.
    pub const fn needs_token_maps(&self) -> bool {
        self.token_span().pages_unpaired()
    }

    /// The token runs the fragment reads in a source page.
    pub const fn src_token_runs(&self) -> TokenRuns {
        TokenRuns {
            offset: self.src_byte_offset,
            page_size: self.src_page_size,
            runs: self.token_runs,
            run_bytes: self.token_run_bytes,
            token_stride: self.src_token_stride_bytes,
            run_stride: self.src_token_run_stride_bytes,
        }
    }

    /// The token runs the fragment writes in a destination page.
    pub const fn dst_token_runs(&self) -> TokenRuns {
        TokenRuns {
            offset: self.dst_byte_offset,
            page_size: self.dst_page_size,
            runs: self.token_runs,
            run_bytes: self.token_run_bytes,
            token_stride: self.dst_token_stride_bytes,
            run_stride: self.dst_token_run_stride_bytes,
        }
    }

    /// Every integer lies in [0, 2^63), as the wire format requires, and the runs fit.
    pub fn validate(&self) -> PlanResult<()> {
        if self.int_bits() <= MAX_VALUE {
            self.validate_rows()?;
            return self.validate_tokens();
        }
        // Past the one test (every field in range): name the culprit.
        for (field, value) in FIELDS.iter().zip(self.values()) {
            let int = match value {
                FieldValue::Int(v) | FieldValue::OptionalInt(Some(v)) => v,
                FieldValue::OptionalInt(None) | FieldValue::Kind(_) => continue,
            };
            if int > MAX_VALUE {
                bail!("{}={int} must be below 2^63", field.name);
            }
        }
        self.validate_rows()?;
        self.validate_tokens()
    }

    /// Token geometry is absent (every token field 0) or whole: page sizes and runs in range,
    /// and one side's pieces never overlap each other.
    fn validate_tokens(&self) -> PlanResult<()> {
        if self.pages_unpaired > 1 {
            bail!("pages_unpaired={} must be 0 or 1", self.pages_unpaired);
        }
        let span = self.token_span();
        for (name, tokens) in [
            ("sliding_window", self.sliding_window),
            ("attention_chunk_size", self.attention_chunk_size),
        ] {
            let Some(tokens) = tokens else { continue };
            if tokens == 0 || span.src_page_size == 0 {
                bail!(
                    "{name}={tokens} needs token geometry (src_page_size > 0) and a positive \
                     token count; leave it None to move every token"
                );
            }
        }
        if self.sliding_window.is_some() && self.attention_chunk_size.is_some() {
            bail!("a fragment keeps a sliding window or an attention chunk, not both");
        }
        if !span.is_present() && span.dst_page_size == 0 {
            if span != TokenSpan::default() {
                bail!(
                    "a fragment without token geometry (src_page_size=0, dst_page_size=0) must \
                     have every token field 0, got {span:?}"
                );
            }
            return Ok(());
        }
        for (name, size) in [
            ("src_page_size", span.src_page_size),
            ("dst_page_size", span.dst_page_size),
        ] {
            limits::PAGE_SIZE.check(name, size)?;
        }
        limits::ROWS_PER_PAGE.check("token_runs", span.runs)?;
        if span.run_bytes == 0 {
            bail!("token_run_bytes must be positive");
        }
        for (side, runs) in [
            ("src", self.src_token_runs()),
            ("dst", self.dst_token_runs()),
        ] {
            if runs.runs == 1 && runs.run_stride != 0 {
                bail!(
                    "{side}_token_run_stride_bytes={} must be 0 for a fragment of one run a token",
                    runs.run_stride
                );
            }
            if !runs.pieces_disjoint() {
                bail!(
                    "the {side} side's token pieces overlap: {} runs {} bytes apart of {} tokens \
                     {} bytes apart, {} bytes each, must nest (runs apart by at least a run's \
                     tokens, or tokens apart by at least a token's runs)",
                    runs.runs,
                    runs.run_stride,
                    runs.page_size,
                    runs.token_stride,
                    runs.run_bytes
                );
            }
            if runs.reach().is_none() {
                bail!("the {side} token runs of a page pass 2^64 bytes");
            }
        }
        Ok(())
    }

    fn validate_rows(&self) -> PlanResult<()> {
        let rows = limits::ROWS_PER_PAGE.check("rows_per_page", self.rows_per_page)?;
        if rows == 1 {
            if self.src_row_stride_bytes != 0 || self.dst_row_stride_bytes != 0 {
                bail!(
                    "a fragment with rows_per_page=1 moves one span a page; its row strides must \
                     be 0, got src_row_stride_bytes={} dst_row_stride_bytes={}",
                    self.src_row_stride_bytes,
                    self.dst_row_stride_bytes
                );
            }
            return Ok(());
        }
        if self.bytes_per_page % rows != 0 {
            bail!(
                "bytes_per_page={} must be a whole number of rows_per_page={rows} runs",
                self.bytes_per_page
            );
        }
        let run = self.run_bytes();
        if self.src_row_stride_bytes < run || self.dst_row_stride_bytes < run {
            bail!(
                "row strides (src {}, dst {}) must be at least the {run}-byte run of a row, or \
                 the rows of one page would overlap",
                self.src_row_stride_bytes,
                self.dst_row_stride_bytes
            );
        }
        Ok(())
    }
}
