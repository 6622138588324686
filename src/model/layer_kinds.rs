//! The layer-kind schema: each kind's name, Python class and fields, written once. The binding
//! reads and builds layer objects from it with no code of its own per kind, a test holds the
//! Python dataclasses (names, order, defaults) to it, and the docs' table of layer kinds is
//! written from it. Adding a kind is a row here (and its two arms below), its buffers
//! (`layers.rs`) and its reader.

use super::deepseek_v4::DeepseekV4Shape;
use super::layers::{
    AttentionShape, GatedDeltaNetShape, KdaShape, Layer, LightningShape, Mamba1Shape, Mamba2Shape,
    MlaShape, ShortConvShape,
};
use crate::error::{bail, quoted, PlanResult};

/// What one field of a layer kind holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KindType {
    /// A non-negative integer; `Some(d)`: `d` when not given.
    Int(Option<u64>),
    /// A non-negative integer or None (the default).
    OptionalInt,
    /// A layer of the named kind.
    Layer(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KindField {
    pub name: &'static str,
    pub ty: KindType,
    pub doc: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerKind {
    /// The kind's name (`AttentionLayer.kind`).
    pub kind: &'static str,
    /// The Python dataclass (in `pdplan`).
    pub class: &'static str,
    /// What the layer keeps, one line.
    pub keeps: &'static str,
    pub fields: &'static [KindField],
}

const fn int(name: &'static str, doc: &'static str) -> KindField {
    KindField {
        name,
        ty: KindType::Int(None),
        doc,
    }
}

const fn int_or(name: &'static str, default: u64, doc: &'static str) -> KindField {
    KindField {
        name,
        ty: KindType::Int(Some(default)),
        doc,
    }
}

const fn optional(name: &'static str, doc: &'static str) -> KindField {
    KindField {
        name,
        ty: KindType::OptionalInt,
        doc,
    }
}

const fn part(name: &'static str, kind: &'static str, doc: &'static str) -> KindField {
    KindField {
        name,
        ty: KindType::Layer(kind),
        doc,
    }
}

const CONV_KERNEL: KindField = int_or("conv_kernel", 4, "the convolution's width");

pub const LAYER_KINDS: &[LayerKind] = &[
    LayerKind {
        kind: "attention",
        class: "AttentionLayer",
        keeps: "K and V, `kv_heads` x `head_dim` a token",
        fields: &[
            int("kv_heads", "KV heads"),
            int("head_dim", "K's head dim (and V's)"),
            optional("sliding_window", "tokens a sliding-window layer keeps"),
            optional("v_head_dim", "V's head dim where it differs from K's"),
            optional(
                "attention_chunk_size",
                "a chunked local-attention layer's chunk",
            ),
            int_or(
                "index_head_dim",
                0,
                "a sparse layer's index key dim (MiniMax-M3; 0: none)",
            ),
        ],
    },
    LayerKind {
        kind: "mla",
        class: "MlaLayer",
        keeps: "one replicated latent a token (and an indexer's key cache)",
        fields: &[
            int("kv_lora_rank", "the latent's rank"),
            int_or("rope_head_dim", 0, "the rope part's dim"),
            int_or("index_head_dim", 0, "the indexer's key dim (0: none)"),
        ],
    },
    LayerKind {
        kind: "mamba2",
        class: "Mamba2Layer",
        keeps: "SSM state `[heads, head_dim, state_size]`, conv state over `x | B | C`",
        fields: &[
            int("heads", "SSM heads"),
            int("head_dim", "a head's dim"),
            int("state_size", "the SSM state's size"),
            int_or("groups", 1, "B and C groups"),
            CONV_KERNEL,
        ],
    },
    LayerKind {
        kind: "mamba1",
        class: "Mamba1Layer",
        keeps: "SSM state `[inner_size, state_size]`, conv state `[inner_size, conv_kernel - 1]`",
        fields: &[
            int("inner_size", "the mixer's channels"),
            int("state_size", "the SSM state's size"),
            CONV_KERNEL,
        ],
    },
    LayerKind {
        kind: "gated_deltanet",
        class: "GatedDeltaNetLayer",
        keeps: "recurrent state `[value_heads, key_head_dim, value_head_dim]`, conv state over \
                `q | k | v`",
        fields: &[
            int("key_heads", "key heads"),
            int("value_heads", "value heads"),
            int("key_head_dim", "a key head's dim"),
            int("value_head_dim", "a value head's dim"),
            CONV_KERNEL,
        ],
    },
    LayerKind {
        kind: "kda",
        class: "KdaLayer",
        keeps: "recurrent state `[heads, head_dim, head_dim]`, conv states of q, k and v",
        fields: &[
            int("heads", "heads"),
            int("head_dim", "a head's dim"),
            CONV_KERNEL,
        ],
    },
    LayerKind {
        kind: "lightning",
        class: "LightningAttentionLayer",
        keeps: "state `[heads, head_dim, head_dim]`",
        fields: &[int("heads", "heads"), int("head_dim", "a head's dim")],
    },
    LayerKind {
        kind: "short_conv",
        class: "ShortConvLayer",
        keeps: "conv state `[channels, conv_kernel - 1]`",
        fields: &[
            int("channels", "conv channels"),
            int("conv_kernel", "the convolution's width"),
        ],
    },
    LayerKind {
        kind: "attention_mamba2",
        class: "AttentionMamba2Layer",
        keeps: "the attention's buffers, then the Mamba2 ones",
        fields: &[
            part("attention", "attention", "the attention half"),
            part("mamba", "mamba2", "the Mamba2 half"),
        ],
    },
    LayerKind {
        kind: "shared_kv",
        class: "SharedKvLayer",
        keeps: "nothing: it reads an earlier layer's KV",
        fields: &[int("source_layer", "the layer whose KV it reads")],
    },
    LayerKind {
        kind: "deepseek_v4",
        class: "DeepseekV4Layer",
        keeps: "a sliding latent; with `compress_ratio` 4 or 128 a latent per that many tokens \
                and the compressor's state; at 4 the indexer's keys and its compressor's state",
        fields: &[
            int("head_dim", "the latent's dim"),
            int("sliding_window", "tokens the sliding latent keeps"),
            int_or("rope_head_dim", 64, "the latent's rope dims"),
            int_or(
                "compress_ratio",
                1,
                "tokens a compressed entry covers (1: none, 4, 128)",
            ),
            int_or("index_head_dim", 0, "the indexer's key dim (at ratio 4)"),
        ],
    },
    LayerKind {
        kind: "mlp",
        class: "MlpLayer",
        keeps: "nothing (an MLP or MoE block; it still counts for pipeline stages)",
        fields: &[],
    },
];

/// The schema row of kind `name`, or a refusal naming every kind.
pub fn kind_of(name: &str) -> PlanResult<&'static LayerKind> {
    if let Some(kind) = LAYER_KINDS.iter().find(|k| k.kind == name) {
        return Ok(kind);
    }
    let names: Vec<_> = LAYER_KINDS.iter().map(|k| k.kind).collect();
    bail!(
        "unknown layer kind {}: use one of {}",
        quoted(name),
        names.join(", ")
    )
}

/// One field's value, as the schema types it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KindValue {
    Int(u64),
    OptionalInt(Option<u64>),
    Layer(Layer),
}

/// Field values taken in schema order.
struct Values {
    kind: &'static str,
    values: std::vec::IntoIter<KindValue>,
}

impl Values {
    fn next(&mut self) -> PlanResult<KindValue> {
        match self.values.next() {
            Some(value) => Ok(value),
            None => bail!("a {} layer is missing a field", self.kind),
        }
    }

    fn int(&mut self) -> PlanResult<u64> {
        match self.next()? {
            KindValue::Int(v) => Ok(v),
            other => bail!(
                "a {} layer's field must be an int, got {other:?}",
                self.kind
            ),
        }
    }

    fn optional(&mut self) -> PlanResult<Option<u64>> {
        match self.next()? {
            KindValue::OptionalInt(v) => Ok(v),
            other => bail!(
                "a {} layer's field must be an int or None, got {other:?}",
                self.kind
            ),
        }
    }

    fn layer(&mut self) -> PlanResult<Layer> {
        match self.next()? {
            KindValue::Layer(layer) => Ok(layer),
            other => bail!(
                "a {} layer's field must be a layer, got {other:?}",
                self.kind
            ),
        }
    }
}

impl Layer {
    /// This layer's schema row (the test below holds each variant to the row of its name).
    pub fn schema(&self) -> &'static LayerKind {
        let row = match self {
            Self::Attention(_) => 0,
            Self::Mla(_) => 1,
            Self::Mamba2(_) => 2,
            Self::Mamba1(_) => 3,
            Self::GatedDeltaNet(_) => 4,
            Self::Kda(_) => 5,
            Self::Lightning(_) => 6,
            Self::ShortConv(_) => 7,
            Self::AttentionMamba2(..) => 8,
            Self::SharedKv { .. } => 9,
            Self::Mlp => 11,
            Self::DeepseekV4(_) => 10,
        };
        &LAYER_KINDS[row]
    }

    /// The layer's field values in its schema row's order.
    pub fn values(&self) -> Vec<KindValue> {
        use KindValue::{Int, OptionalInt};
        match *self {
            Self::Attention(a) => vec![
                Int(a.kv_heads),
                Int(a.head_dim),
                OptionalInt(a.sliding_window),
                OptionalInt(a.v_head_dim),
                OptionalInt(a.attention_chunk),
                Int(a.index_head_dim),
            ],
            Self::Mla(m) => vec![
                Int(m.kv_lora_rank),
                Int(m.rope_head_dim),
                Int(m.index_head_dim),
            ],
            Self::Mamba2(m) => vec![
                Int(m.heads),
                Int(m.head_dim),
                Int(m.state_size),
                Int(m.groups),
                Int(m.conv_kernel),
            ],
            Self::Mamba1(m) => vec![Int(m.inner_size), Int(m.state_size), Int(m.conv_kernel)],
            Self::GatedDeltaNet(g) => vec![
                Int(g.key_heads),
                Int(g.value_heads),
                Int(g.key_head_dim),
                Int(g.value_head_dim),
                Int(g.conv_kernel),
            ],
            Self::Kda(k) => vec![Int(k.heads), Int(k.head_dim), Int(k.conv_kernel)],
            Self::Lightning(l) => vec![Int(l.heads), Int(l.head_dim)],
            Self::ShortConv(c) => vec![Int(c.channels), Int(c.conv_kernel)],
            Self::AttentionMamba2(a, m) => vec![
                KindValue::Layer(Self::Attention(a)),
                KindValue::Layer(Self::Mamba2(m)),
            ],
            Self::SharedKv { source_layer } => vec![Int(source_layer)],
            Self::Mlp => Vec::new(),
            Self::DeepseekV4(d) => vec![
                Int(d.head_dim),
                Int(d.sliding_window),
                Int(d.rope_head_dim),
                Int(d.compress_ratio),
                Int(d.index_head_dim),
            ],
        }
    }

    /// The layer of `kind` from its field values in schema order (as `values` gives them).
    pub fn from_values(kind: &LayerKind, values: Vec<KindValue>) -> PlanResult<Self> {
        if values.len() != kind.fields.len() {
            bail!(
                "a {} layer has {} fields, got {}",
                kind.kind,
                kind.fields.len(),
                values.len()
            );
        }
        let mut v = Values {
            kind: kind.kind,
            values: values.into_iter(),
        };
        Ok(match kind.kind {
            "attention" => Self::Attention(AttentionShape {
                kv_heads: v.int()?,
                head_dim: v.int()?,
                sliding_window: v.optional()?,
                v_head_dim: v.optional()?,
                attention_chunk: v.optional()?,
                index_head_dim: v.int()?,
            }),
            "mla" => Self::Mla(MlaShape {
                kv_lora_rank: v.int()?,
                rope_head_dim: v.int()?,
                index_head_dim: v.int()?,
            }),
            "mamba2" => Self::Mamba2(Mamba2Shape {
                heads: v.int()?,
                head_dim: v.int()?,
                state_size: v.int()?,
                groups: v.int()?,
                conv_kernel: v.int()?,
            }),
            "mamba1" => Self::Mamba1(Mamba1Shape {
                inner_size: v.int()?,
                state_size: v.int()?,
                conv_kernel: v.int()?,
            }),
            "gated_deltanet" => Self::GatedDeltaNet(GatedDeltaNetShape {
                key_heads: v.int()?,
                value_heads: v.int()?,
                key_head_dim: v.int()?,
                value_head_dim: v.int()?,
                conv_kernel: v.int()?,
            }),
            "kda" => Self::Kda(KdaShape {
                heads: v.int()?,
                head_dim: v.int()?,
                conv_kernel: v.int()?,
            }),
            "lightning" => Self::Lightning(LightningShape {
                heads: v.int()?,
                head_dim: v.int()?,
            }),
            "short_conv" => Self::ShortConv(ShortConvShape {
                channels: v.int()?,
                conv_kernel: v.int()?,
            }),
            "attention_mamba2" => match (v.layer()?, v.layer()?) {
                (Self::Attention(a), Self::Mamba2(m)) => Self::AttentionMamba2(a, m),
                _ => bail!("an attention_mamba2 layer is an attention layer and a mamba2 layer"),
            },
            "shared_kv" => Self::SharedKv {
                source_layer: v.int()?,
            },
            "deepseek_v4" => Self::DeepseekV4(DeepseekV4Shape {
                head_dim: v.int()?,
                sliding_window: v.int()?,
                rope_head_dim: v.int()?,
                compress_ratio: v.int()?,
                index_head_dim: v.int()?,
            }),
            "mlp" => Self::Mlp,
            other => bail!("the layer-kind schema has no reader for {other:?} (a bug in pdplan)"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One layer of every kind, each field a distinct value.
    fn samples() -> Vec<Layer> {
        let attention = AttentionShape {
            kv_heads: 8,
            head_dim: 128,
            sliding_window: Some(4096),
            v_head_dim: None,
            attention_chunk: Some(8192),
            index_head_dim: 128,
        };
        let mamba = Mamba2Shape {
            heads: 64,
            head_dim: 64,
            state_size: 128,
            groups: 8,
            conv_kernel: 4,
        };
        vec![
            Layer::Attention(attention),
            Layer::Mla(MlaShape {
                kv_lora_rank: 512,
                rope_head_dim: 64,
                index_head_dim: 128,
            }),
            Layer::Mamba2(mamba),
            Layer::Mamba1(Mamba1Shape {
                inner_size: 8192,
                state_size: 16,
                conv_kernel: 4,
            }),
            Layer::GatedDeltaNet(GatedDeltaNetShape {
                key_heads: 16,
                value_heads: 32,
                key_head_dim: 128,
                value_head_dim: 128,
                conv_kernel: 4,
            }),
            Layer::Kda(KdaShape {
                heads: 32,
                head_dim: 128,
                conv_kernel: 4,
            }),
            Layer::Lightning(LightningShape {
                heads: 64,
                head_dim: 96,
            }),
            Layer::ShortConv(ShortConvShape {
                channels: 2048,
                conv_kernel: 3,
            }),
            Layer::AttentionMamba2(attention, mamba),
            Layer::SharedKv { source_layer: 3 },
            Layer::DeepseekV4(DeepseekV4Shape {
                head_dim: 512,
                rope_head_dim: 64,
                sliding_window: 128,
                compress_ratio: 4,
                index_head_dim: 128,
            }),
            Layer::Mlp,
        ]
    }

    #[test]
    fn every_kind_has_one_row_and_round_trips_through_it() {
        let layers = samples();
        assert_eq!(layers.len(), LAYER_KINDS.len());
        for (layer, row) in layers.iter().zip(LAYER_KINDS) {
            assert_eq!(layer.schema(), row);
            assert_eq!(kind_of(layer.kind()).unwrap(), row);
            // Built back from its row's values, it is the same variant: row and variant agree.
            let values = layer.values();
            assert_eq!(values.len(), row.fields.len(), "{}", row.kind);
            for (value, field) in values.iter().zip(row.fields) {
                let fits = matches!(
                    (value, field.ty),
                    (KindValue::Int(_), KindType::Int(_))
                        | (KindValue::OptionalInt(_), KindType::OptionalInt)
                        | (KindValue::Layer(_), KindType::Layer(_))
                );
                assert!(fits, "{}.{}", row.kind, field.name);
            }
            assert_eq!(Layer::from_values(row, values).unwrap(), *layer);
        }
    }

    #[test]
    fn unknown_kinds_and_mismatched_values_are_refused() {
        let err = kind_of("rwkv").unwrap_err();
        assert!(err.message().contains("attention, mla, mamba2"), "{err}");
        let mlp = kind_of("mlp").unwrap();
        assert!(Layer::from_values(mlp, vec![KindValue::Int(1)]).is_err());
        let hybrid = kind_of("attention_mamba2").unwrap();
        let wrong = vec![KindValue::Layer(Layer::Mlp), KindValue::Layer(Layer::Mlp)];
        assert!(Layer::from_values(hybrid, wrong).is_err());
    }
}
