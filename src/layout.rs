//! What each side looks like: its parallel layout (role, rank space, how its pipeline stages
//! split the layers) and the buffers it caches, each validated on its own at construction.

use crate::context::{CpKv, CpSplit, TokenDeal, TokenShare};
use crate::error::{bail, quoted, PlanError, PlanResult};
use crate::limits::{self, MAX_VALUE};
pub use crate::parts::{LogicalParts, PartCut};
use crate::ranks::{index_below, RankCoord, RankSpace, Slot};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Prefill,
    Decode,
}

impl Role {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "prefill" => Ok(Self::Prefill),
            "decode" => Ok(Self::Decode),
            other => bail!("role must be 'prefill' or 'decode', got {}", quoted(other)),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogicalAxis {
    /// Sharded by KV head across TP ranks (possibly in GQA replica groups).
    KvHead,
    /// Sharded by state channel across TP ranks (Mamba / linear attention state).
    StateChannel,
    /// Every TP rank holds the whole buffer (MLA latent cache).
    Replicated,
}

impl LogicalAxis {
    pub fn parse(text: &str) -> PlanResult<Self> {
        match text {
            "kv_head" => Ok(Self::KvHead),
            "state_channel" => Ok(Self::StateChannel),
            "replicated" => Ok(Self::Replicated),
            other => bail!(
                "logical_axis must be 'kv_head', 'state_channel' or 'replicated', got {}",
                quoted(other)
            ),
        }
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::KvHead => "kv_head",
            Self::StateChannel => "state_channel",
            Self::Replicated => "replicated",
        }
    }

    pub const fn is_sharded(self) -> bool {
        !matches!(self, Self::Replicated)
    }

    /// Whether a page holds the buffer token by token (KV caches), so slot maps apply; state
    /// is one value per request.
    pub const fn is_token_indexed(self) -> bool {
        !matches!(self, Self::StateChannel)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum BufferKind {
    #[default]
    TargetK,
    TargetV,
    DraftK,
    DraftV,
    MambaState,
}

impl BufferKind {
    pub const ALL: [Self; 5] = [
        Self::TargetK,
        Self::TargetV,
        Self::DraftK,
        Self::DraftV,
        Self::MambaState,
    ];

    pub fn parse(text: &str) -> PlanResult<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == text)
            .ok_or_else(|| {
                PlanError::new(format!(
                    "buffer_kind must be one of target_k, target_v, draft_k, draft_v, \
                     mamba_state; got {}",
                    quoted(text)
                ))
            })
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TargetK => "target_k",
            Self::TargetV => "target_v",
            Self::DraftK => "draft_k",
            Self::DraftV => "draft_v",
            Self::MambaState => "mamba_state",
        }
    }

    /// Whose pointers a `buffer_index` of this kind numbers: a runtime may number its KV
    /// buffers and its state buffers apart, each from 0 (the reference runtime's Mooncake
    /// receiver resolves an index against its KV pointers or its state pointers by kind).
    pub const fn index_space(self) -> IndexSpace {
        match self {
            Self::MambaState => IndexSpace::State,
            _ => IndexSpace::Kv,
        }
    }
}

/// The pointers a `buffer_index` numbers: KV caches' (target and draft K and V) or recurrent
/// state's. An index is one buffer within its space; the two spaces may reuse indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IndexSpace {
    Kv,
    State,
}

impl IndexSpace {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kv => "KV",
            Self::State => "state",
        }
    }
}

/// How one side spreads a request's tokens: over CP ranks of their own (`cp_size`), or over
/// DCP ranks carved out of TP (`dcp_size`, the DCP rank of TP rank `r` being `r % dcp_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContextParallel {
    pub cp_size: u64,
    pub dcp_size: u64,
    /// Whether CP ranks hold disjoint shares (sharded) or every token (replicated).
    pub kv: CpKv,
    pub split: CpSplit,
    pub interleave: u64,
}

impl ContextParallel {
    /// No context parallelism: every rank holds every token.
    pub const NONE: Self = Self {
        cp_size: 1,
        dcp_size: 1,
        kv: CpKv::Sharded,
        split: CpSplit::Interleave,
        interleave: 1,
    };

    /// Ranks the tokens are dealt over (1: none).
    pub const fn ways(&self) -> u64 {
        match self.kv {
            CpKv::Replicated => self.dcp_size,
            CpKv::Sharded => self.cp_size * self.dcp_size,
        }
    }

    /// Whether this side spreads tokens over ranks, or holds them in CP replicas.
    pub const fn is_active(&self) -> bool {
        self.cp_size > 1 || self.dcp_size > 1
    }

    /// CP ranks holding the same tokens (replicated CP), else 1.
    pub const fn cp_replicas(&self) -> u64 {
        match self.kv {
            CpKv::Replicated => self.cp_size,
            CpKv::Sharded => 1,
        }
    }

    /// The deal of tokens over this side's ranks, blocks of `page_size` for contiguous splits.
    pub fn deal(&self, page_size: u64) -> PlanResult<TokenDeal> {
        TokenDeal::new(self.ways(), self.split, self.interleave, page_size)
    }

    /// Which rank of the deal the rank at `slot` is (its CP rank, or its DCP rank).
    pub const fn share_index(&self, slot: Slot) -> u64 {
        if self.dcp_size > 1 {
            slot.tp_rank % self.dcp_size
        } else if matches!(self.kv, CpKv::Sharded) {
            slot.cp_rank
        } else {
            0
        }
    }

    /// The tokens the rank at `slot` holds, under `deal`.
    pub const fn share(&self, deal: TokenDeal, slot: Slot) -> TokenShare {
        TokenShare {
            deal,
            index: self.share_index(slot),
        }
    }
}

/// One side's ranks: `dp_size` DP groups, each of `pp_size` pipeline stages of `cp_size` CP
/// ranks of TP ranks, how the stages split the layers, and how tokens are spread.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParallelLayout {
    role: Role,
    ranks: RankSpace,
    /// Layers of each stage, in order; `None` splits the layers as evenly as possible, the
    /// first stages taking one more.
    pp_layer_partition: Option<Vec<u64>>,
    context: ContextParallel,
}

impl ParallelLayout {
    /// A layout without pipeline parallelism.
    pub fn new(role: Role, world_size: u64, dp_size: u64) -> PlanResult<Self> {
        Self::with_stages(role, world_size, dp_size, 1, None)
    }

    /// A layout with `pp_size` pipeline stages a DP group (`world = dp x pp x tp`).
    pub fn with_stages(
        role: Role,
        world_size: u64,
        dp_size: u64,
        pp_size: u64,
        pp_layer_partition: Option<Vec<u64>>,
    ) -> PlanResult<Self> {
        Self::with_context(
            role,
            (world_size, dp_size, pp_size),
            pp_layer_partition,
            ContextParallel::NONE,
        )
    }

    /// A layout with stages and context parallelism: `(world_size, dp_size, pp_size)` with
    /// `world = dp x pp x cp x tp`.
    pub fn with_context(
        role: Role,
        (world_size, dp_size, pp_size): (u64, u64, u64),
        pp_layer_partition: Option<Vec<u64>>,
        context: ContextParallel,
    ) -> PlanResult<Self> {
        let ranks = RankSpace::from_world(world_size, dp_size, pp_size, context.cp_size)?;
        check_context(role, ranks, &context)?;
        if let Some(partition) = &pp_layer_partition {
            if partition.len() as u64 != pp_size {
                bail!(
                    "pp_layer_partition {partition:?} has {} entries; give one layer count per \
                     stage ({pp_size})",
                    partition.len()
                );
            }
            if partition
                .iter()
                .any(|&layers| layers == 0 || layers > MAX_VALUE)
            {
                bail!("pp_layer_partition {partition:?}: every stage must hold at least one layer");
            }
            let total = partition
                .iter()
                .try_fold(0u64, |sum, &n| sum.checked_add(n));
            if total.is_none_or(|total| total > MAX_VALUE) {
                bail!("pp_layer_partition {partition:?} adds up to more than 2^63 layers");
            }
        }
        Ok(Self {
            role,
            ranks,
            pp_layer_partition,
            context,
        })
    }

    /// How this side spreads a request's tokens over its ranks.
    pub const fn context(&self) -> &ContextParallel {
        &self.context
    }

    pub const fn role(&self) -> Role {
        self.role
    }

    /// How this side numbers its ranks.
    pub const fn ranks(&self) -> RankSpace {
        self.ranks
    }

    pub const fn world_size(&self) -> u64 {
        self.ranks.world_size()
    }

    pub const fn dp_size(&self) -> u64 {
        self.ranks.dp_size()
    }

    pub const fn pp_size(&self) -> u64 {
        self.ranks.pp_size()
    }

    /// Where rank `value` (whatever integer a caller gave) sits, or why it is no rank here.
    /// The share of a request's tokens rank `value` holds (the whole request without context
    /// parallelism), a contiguous split dealt in blocks of `page_size` tokens.
    pub fn token_share(&self, value: i128, page_size: u64) -> PlanResult<TokenShare> {
        let slot = self.rank_coord(value)?.slot();
        Ok(self.context.share(self.context.deal(page_size)?, slot))
    }

    pub fn rank_coord(&self, value: i128) -> PlanResult<RankCoord> {
        let world = self.world_size();
        let Some(rank) = index_below(value, world) else {
            bail!(
                "rank={value} is out of range: the {} side has {world} ranks (0..{world})",
                self.role.as_str()
            );
        };
        Ok(self.ranks.coord(rank))
    }

    /// Each stage's layer count, when one was given.
    pub fn pp_layer_partition(&self) -> Option<&[u64]> {
        self.pp_layer_partition.as_deref()
    }
}

/// The context-parallel fields of one side make sense on their own and with its TP size.
fn check_context(role: Role, ranks: RankSpace, context: &ContextParallel) -> PlanResult<()> {
    let side = role.as_str();
    let (cp, dcp, tp) = (context.cp_size, context.dcp_size, ranks.tp_size());
    if dcp == 0 || tp % dcp != 0 {
        bail!(
            "dcp_size={dcp} must be positive and divide the {side} side's TP size {tp}: \
             decode-context-parallel ranks are carved out of TP"
        );
    }
    if cp > 1 && dcp > 1 {
        bail!(
            "the {side} side has cp_size={cp} and dcp_size={dcp}; a side spreads tokens one way \
             only: give it CP ranks of their own (cp_size) or DCP inside TP (dcp_size), not both"
        );
    }
    limits::INTERLEAVE.check("cp_interleave", context.interleave)?;
    if dcp > 1 && context.kv == CpKv::Replicated {
        bail!(
            "cp_kv='replicated' describes CP ranks of their own (cp_size); DCP ranks always hold \
             disjoint token shares, so leave cp_kv 'sharded' with dcp_size={dcp}"
        );
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufferLayout {
    pub buffer_index: u64,
    pub buffer_kind: BufferKind,
    pub logical_axis: LogicalAxis,
    /// Logical units (heads, channels) in the whole buffer, across all TP ranks.
    pub logical_size: u64,
    pub page_size: u64,
    /// Bytes one logical unit takes in one page of this rank's item.
    pub bytes_per_logical_unit: u64,
    /// Bytes between consecutive pages of this rank's buffer.
    pub item_stride_bytes: u64,
    /// TP ranks that hold the same shard (GQA heads replicated when TP exceeds them).
    pub tp_replica_group_size: u64,
    /// The model layer the buffer belongs to; required (and used) when either side has
    /// pipeline stages, which hold layers in order.
    pub layer: Option<u64>,
    /// Rows of a page: each row holds the rank's units in order, a unit taking
    /// `bytes_per_logical_unit / rows_per_page` bytes of it, rows `page_bytes() /
    /// rows_per_page` apart. 1 is head-major; `page_size` is token-major (NHD).
    pub rows_per_page: u64,
    /// Bytes of each page this buffer owns, from the page's start: the rest of the
    /// `item_stride_bytes` belongs to other buffers (K and V of one fused page). `None`: the
    /// whole stride.
    pub page_bytes: Option<u64>,
    pub logical_parts: LogicalParts,
    /// Tokens a sliding-window attention layer keeps: with token maps a request of `n` tokens
    /// moves only its tokens `t >= n - sliding_window`. `None`: every token.
    pub sliding_window: Option<u64>,
    /// A chunked local-attention layer's chunk (tokens, Llama 4): with token maps a request of
    /// `n` tokens moves only its current chunk, tokens `t >= (n / chunk) * chunk`.
    pub attention_chunk_size: Option<u64>,
    /// Where a head-major unit's tokens lie when not one after another (`TokenPieces`).
    pub token_pieces: TokenPieces,
}

/// Where the tokens of a head-major unit's page lie, when not one after another: the unit's
/// page is cut into equal planes, and within plane `i` a token's bytes lie in `pieces[i]`
/// equal pieces, the page's tokens one after another inside each piece. vLLM's CPU backend
/// keeps each head's K transposed, then its V: `(head_size, 1)`. None given: one plane of one
/// piece (a unit's tokens one after another). Only token moves read it: pages that pair move
/// whole either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TokenPieces {
    count: usize,
    pieces: [u64; MAX_TOKEN_PLANES],
}

/// Planes a unit's page may be cut into (`TokenPieces`).
pub const MAX_TOKEN_PLANES: usize = 4;

impl TokenPieces {
    /// A unit's tokens one after another.
    pub const NONE: Self = Self {
        count: 0,
        pieces: [0; MAX_TOKEN_PLANES],
    };

    pub fn new(pieces: &[u64]) -> PlanResult<Self> {
        if pieces.is_empty() || pieces.len() > MAX_TOKEN_PLANES {
            bail!(
                "token_pieces names 1 to {MAX_TOKEN_PLANES} planes, got {}",
                pieces.len()
            );
        }
        let mut out = Self::NONE;
        for (slot, &n) in out.pieces.iter_mut().zip(pieces) {
            if n == 0 || n > limits::MAX_WORLD_SIZE {
                bail!(
                    "token_pieces {pieces:?}: each plane's pieces must be 1 to {}",
                    limits::MAX_WORLD_SIZE
                );
            }
            *slot = n;
        }
        out.count = pieces.len();
        Ok(out)
    }

    /// The pieces of each plane as given (empty: none given).
    pub fn given(&self) -> &[u64] {
        self.pieces.get(..self.count).unwrap_or(&[])
    }
}

/// The first token of an `n`-token request that a buffer with this window or chunk keeps:
/// the last `window` tokens, or the current chunk. The one home of that rule: slot-map
/// descriptors ask it, and the command through `_core.first_kept_token`.
pub fn first_kept_token(n: u64, sliding_window: Option<u64>, chunk: Option<u64>) -> u64 {
    let by_window = sliding_window.map_or(0, |w| n.saturating_sub(w));
    let by_chunk = chunk.filter(|&c| c > 0).map_or(0, |c| n / c * c);
    by_window.max(by_chunk)
}

/// Checks that no two of one side's buffers share a `buffer_index` within one index space: a
/// request's descriptors find a buffer's memory by its index (and kind), so two buffers of one
/// index and space would land on the same bytes. A KV buffer and a state buffer may share an
/// index, as a runtime numbering its KV and state pointers apart numbers them.
pub fn check_distinct_indexes(buffers: &[BufferLayout]) -> PlanResult<()> {
    let mut first_at: std::collections::HashMap<(IndexSpace, u64), usize> =
        std::collections::HashMap::with_capacity(buffers.len());
    for (position, buffer) in buffers.iter().enumerate() {
        let space = buffer.buffer_kind.index_space();
        if let Some(first) = first_at.insert((space, buffer.buffer_index), position) {
            bail!(
                "buffers {first} and {position} both have buffer_index {} among the {} \
                 buffers: give each buffer of a side its own index within its kind's space \
                 (KV buffers and state buffers may each count from 0; pdplan.CacheBuffers \
                 numbers all 0..n)",
                buffer.buffer_index,
                space.as_str()
            );
        }
    }
    Ok(())
}

impl BufferLayout {
    /// Bytes of each page this buffer owns: its own rows, never another buffer's.
    pub const fn page_extent(&self) -> u64 {
        match self.page_bytes {
            Some(owned) => owned,
            None => self.item_stride_bytes,
        }
    }

    /// Whether pages of this buffer and `other` pair one to one: the same tokens a page, in
    /// the same rows. Otherwise only slot maps move a token-indexed buffer between them
    /// (head-major facing token-major, or pages of different sizes).
    pub const fn pages_pair(&self, other: &Self) -> bool {
        self.page_size == other.page_size && self.rows_per_page == other.rows_per_page
    }

    /// Checks the buffer on its own, as the dataclass does at construction.
    pub fn validate(&self) -> PlanResult<()> {
        let positive = [
            ("logical_size", self.logical_size),
            ("page_size", self.page_size),
            ("bytes_per_logical_unit", self.bytes_per_logical_unit),
            ("item_stride_bytes", self.item_stride_bytes),
            ("tp_replica_group_size", self.tp_replica_group_size),
        ];
        for (name, value) in positive {
            if value == 0 {
                bail!("{name} must be positive");
            }
            if value > MAX_VALUE {
                bail!("{name}={value} must be below 2^63");
            }
        }
        if self.buffer_index > MAX_VALUE {
            bail!("buffer_index={} must be below 2^63", self.buffer_index);
        }
        if let Some(layer) = self.layer.filter(|&l| l > MAX_VALUE) {
            bail!("layer={layer} must be below 2^63");
        }
        limits::WORLD_SIZE.check("tp_replica_group_size", self.tp_replica_group_size)?;
        match self.logical_size.checked_mul(self.bytes_per_logical_unit) {
            Some(total) if total <= MAX_VALUE => {}
            _ => bail!(
                "logical_size={} x bytes_per_logical_unit={} must stay below 2^63 bytes",
                self.logical_size,
                self.bytes_per_logical_unit
            ),
        }
        for (name, tokens) in [
            ("sliding_window", self.sliding_window),
            ("attention_chunk_size", self.attention_chunk_size),
        ] {
            let Some(tokens) = tokens else { continue };
            if tokens == 0 || tokens > MAX_VALUE {
                bail!("{name}={tokens} must be a positive token count below 2^63");
            }
            if !self.logical_axis.is_token_indexed() {
                bail!(
                    "{name} applies to buffers indexed by token, not to a {} buffer; leave it \
                     None",
                    self.logical_axis.as_str()
                );
            }
        }
        if self.sliding_window.is_some() && self.attention_chunk_size.is_some() {
            bail!(
                "a buffer keeps a sliding window or an attention chunk, not both; set one of \
                 sliding_window and attention_chunk_size"
            );
        }
        self.validate_rows()?;
        self.validate_token_pieces()?;
        self.validate_parts()
    }

    fn validate_token_pieces(&self) -> PlanResult<()> {
        let pieces = self.token_pieces.given();
        if pieces.is_empty() {
            return Ok(());
        }
        if self.rows_per_page != 1 || !self.logical_axis.is_sharded() {
            bail!(
                "token_pieces describes a head-major unit (rows_per_page 1) of a split axis; \
                 leave it None here"
            );
        }
        let planes = pieces.len() as u64;
        let whole = self.bytes_per_logical_unit % planes == 0
            && pieces.iter().all(|&n| {
                n.checked_mul(self.page_size)
                    .is_some_and(|each| (self.bytes_per_logical_unit / planes) % each == 0)
            });
        if !whole {
            bail!(
                "token_pieces {pieces:?}: bytes_per_logical_unit={} must cut into {planes} equal \
                 planes, each into whole pieces of page_size={} tokens",
                self.bytes_per_logical_unit,
                self.page_size
            );
        }
        Ok(())
    }

    fn validate_rows(&self) -> PlanResult<()> {
        let rows = limits::ROWS_PER_PAGE.check("rows_per_page", self.rows_per_page)?;
        if let Some(owned) = self.page_bytes {
            if owned == 0 || owned > self.item_stride_bytes {
                bail!(
                    "page_bytes={owned} must be positive and at most item_stride_bytes={}: it \
                     is the part of each page this buffer owns",
                    self.item_stride_bytes
                );
            }
        }
        let (owned, name) = match self.page_bytes {
            Some(owned) => (owned, "page_bytes"),
            None => (self.item_stride_bytes, "item_stride_bytes"),
        };
        if self.bytes_per_logical_unit % rows != 0 || owned % rows != 0 {
            bail!(
                "rows_per_page={rows} must divide bytes_per_logical_unit={} (a unit's bytes are \
                 spread evenly over the rows) and {name}={owned} (rows are evenly spaced); \
                 check the page layout",
                self.bytes_per_logical_unit,
            );
        }
        Ok(())
    }

    fn validate_parts(&self) -> PlanResult<()> {
        let given = self.logical_parts.given();
        if given.is_empty() {
            return Ok(());
        }
        if !self.logical_axis.is_sharded() {
            bail!(
                "logical_parts applies to a split axis (kv_head, state_channel), not to a \
                 replicated buffer; leave it None"
            );
        }
        let total = given.iter().try_fold(0u64, |sum, &p| sum.checked_add(p));
        if total != Some(self.logical_size) {
            bail!(
                "logical_parts {given:?} must add up to logical_size={}",
                self.logical_size
            );
        }
        Ok(())
    }

    /// The part sizes of the split axis (one part, the whole axis, unless parts were given).
    pub fn part_sizes(&self) -> impl Iterator<Item = u64> + '_ {
        self.logical_parts.sizes(self.logical_size)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn buffer() -> BufferLayout {
        BufferLayout {
            buffer_index: 0,
            buffer_kind: BufferKind::TargetK,
            logical_axis: LogicalAxis::KvHead,
            logical_size: 8,
            page_size: 16,
            bytes_per_logical_unit: 4096,
            item_stride_bytes: 8 * 4096,
            tp_replica_group_size: 1,
            layer: None,
            rows_per_page: 1,
            page_bytes: None,
            logical_parts: LogicalParts::WHOLE,
            sliding_window: None,
            attention_chunk_size: None,
            token_pieces: TokenPieces::NONE,
        }
    }

    #[test]
    fn parallel_layout_rules() {
        assert_eq!(
            ParallelLayout::new(Role::Prefill, 8, 2)
                .unwrap()
                .ranks()
                .tp_size(),
            4
        );
        assert!(ParallelLayout::new(Role::Prefill, 0, 1).is_err());
        assert!(ParallelLayout::new(Role::Prefill, 8, 0).is_err());
        assert!(ParallelLayout::new(Role::Prefill, 8, 3).is_err());
        let err = ParallelLayout::new(Role::Decode, 1 << 31, 1).unwrap_err();
        assert!(err.message().contains("MAX_WORLD_SIZE"), "{err}");
    }

    #[test]
    fn names_round_trip() {
        for kind in BufferKind::ALL {
            assert_eq!(BufferKind::parse(kind.as_str()).unwrap(), kind);
        }
        assert!(BufferKind::parse("target_q").is_err());
        assert_eq!(LogicalAxis::parse("kv_head").unwrap(), LogicalAxis::KvHead);
        assert!(LogicalAxis::parse("kv_heads").is_err());
        assert_eq!(Role::parse("decode").unwrap().as_str(), "decode");
        assert!(Role::parse("Decode").is_err());
    }

    #[test]
    fn buffer_rules() {
        assert!(buffer().validate().is_ok());
        let nhd = BufferLayout {
            rows_per_page: 16,
            logical_parts: LogicalParts::new(&[4, 2, 2]).unwrap(),
            ..buffer()
        };
        assert!(nhd.validate().is_ok());
        assert_eq!(nhd.part_sizes().collect::<Vec<_>>(), vec![4, 2, 2]);
        assert_eq!(buffer().part_sizes().collect::<Vec<_>>(), vec![8]);
        assert!(LogicalParts::new(&[]).is_err() && LogicalParts::new(&[1; 9]).is_err());
        for broken in [
            BufferLayout {
                logical_size: 0,
                ..buffer()
            },
            BufferLayout {
                page_size: 0,
                ..buffer()
            },
            BufferLayout {
                bytes_per_logical_unit: 0,
                ..buffer()
            },
            BufferLayout {
                item_stride_bytes: 0,
                ..buffer()
            },
            BufferLayout {
                tp_replica_group_size: 0,
                ..buffer()
            },
            BufferLayout {
                item_stride_bytes: 1 << 63,
                ..buffer()
            },
            BufferLayout {
                logical_size: 1 << 40,
                bytes_per_logical_unit: 1 << 40,
                ..buffer()
            },
            BufferLayout {
                rows_per_page: 0,
                ..buffer()
            },
            BufferLayout {
                rows_per_page: 3,
                ..buffer()
            },
            BufferLayout {
                logical_parts: LogicalParts::new(&[4, 3]).unwrap(),
                ..buffer()
            },
            BufferLayout {
                logical_axis: LogicalAxis::Replicated,
                logical_parts: LogicalParts::new(&[4, 4]).unwrap(),
                ..buffer()
            },
            BufferLayout {
                attention_chunk_size: Some(0),
                token_pieces: TokenPieces::NONE,
                ..buffer()
            },
            BufferLayout {
                sliding_window: Some(8),
                attention_chunk_size: Some(8),
                token_pieces: TokenPieces::NONE,
                ..buffer()
            },
            BufferLayout {
                logical_axis: LogicalAxis::StateChannel,
                attention_chunk_size: Some(8),
                token_pieces: TokenPieces::NONE,
                ..buffer()
            },
        ] {
            assert!(broken.validate().is_err(), "{broken:?}");
        }
    }

    #[test]
    fn windows_keep_the_last_tokens_and_chunks_the_current_chunk() {
        assert_eq!(first_kept_token(20, Some(6), None), 14);
        assert_eq!(first_kept_token(4, Some(6), None), 0);
        assert_eq!(first_kept_token(20, None, Some(8)), 16);
        assert_eq!(first_kept_token(16, None, Some(8)), 16);
        assert_eq!(first_kept_token(7, None, Some(8)), 0);
        assert_eq!(first_kept_token(20, None, None), 0);
    }
}
