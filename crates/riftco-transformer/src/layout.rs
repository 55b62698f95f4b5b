//! The parameter layout: one row per parameter tensor of the model, in Hugging Face
//! `LlamaForCausalLM` state-dict order.
//!
//! Each row gives the tensor's Hugging Face name, its shape as a function of the config, its
//! role, its initialisation rule and, for the projections LoRA can adapt, the PEFT module name.
//! Initialisation ([`crate::DecoderOnlyTransformer::new`]), the named parameters
//! ([`crate::Weights::named_base_parameters`], [`crate::Weights::named_lora_parameters`]), the
//! shapes expected at load ([`crate::state::expected_base_shapes`]) and LoRA targeting
//! ([`crate::DecoderOnlyTransformer::enable_lora`], PEFT `target_modules`) all read
//! [`PARAMETERS`]; the only other place that names a parameter is the field it lives in
//! ([`crate::Weights`], [`crate::block::Layer`]), reached through [`Slot`].

use crate::config::TransformerConfig;
use crate::linear::LoraTargets;
use crate::policy::OptionRow;

/// A size of the config that a parameter's shape is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    /// `vocab_size`.
    VocabSize,
    /// `d_model`.
    DModel,
    /// `d_ff`.
    DFf,
    /// `n_kv_heads · d_head`, the output width of `k_proj` and `v_proj` (grouped-query
    /// attention; `d_model` when `n_kv_heads = n_heads`).
    DKv,
}

impl Dim {
    /// The size in `config`.
    pub fn of(self, config: &TransformerConfig) -> usize {
        match self {
            Self::VocabSize => config.vocab_size,
            Self::DModel => config.d_model,
            Self::DFf => config.d_ff,
            Self::DKv => config.d_kv(),
        }
    }
}

/// How a parameter is initialised (Hugging Face `LlamaPreTrainedModel._init_weights` with
/// `initializer_range 0.02`). Every draw comes from the model's one seeded generator, in
/// [`PARAMETERS`] order.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Normal with mean 0 and this standard deviation.
    Normal {
        /// Standard deviation.
        std: f32,
    },
    /// All ones (RMSNorm weights); draws nothing from the generator.
    Ones,
}

/// What a parameter is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Token embedding `[vocab_size, d_model]`.
    Embedding,
    /// An RMSNorm weight `[d_model]`.
    Norm,
    /// A q, k, v or o projection of self-attention (LoRA target group "attention").
    AttentionProjection,
    /// A gate, up or down projection of the SwiGLU MLP (LoRA target group "mlp").
    MlpProjection,
    /// The LM head `[vocab_size, d_model]` (absent when the config ties it to the embedding).
    LmHead,
}

impl Role {
    /// Whether LoRA adapters with `targets` adapt a parameter of this role.
    pub fn targeted_by(self, targets: &LoraTargets) -> bool {
        match self {
            Self::AttentionProjection => targets.attention,
            Self::MlpProjection => targets.mlp,
            Self::Embedding | Self::Norm | Self::LmHead => false,
        }
    }
}

/// The LoRA targets that select exactly the roles for which `selected` holds (the inverse of
/// [`Role::targeted_by`]).
pub fn lora_targets(selected: impl Fn(Role) -> bool) -> LoraTargets {
    LoraTargets {
        attention: selected(Role::AttentionProjection),
        mlp: selected(Role::MlpProjection),
    }
}

/// A model-level parameter (a field of [`crate::Weights`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModelParam {
    /// `Weights::embed`.
    Embedding,
    /// `Weights::final_norm`.
    FinalNorm,
    /// `Weights::lm_head`.
    LmHead,
}

/// A parameter of every block (a field of [`crate::block::Layer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerParam {
    /// `Layer::attn_norm`.
    AttnNorm,
    /// `Layer::q`.
    Q,
    /// `Layer::k`.
    K,
    /// `Layer::v`.
    V,
    /// `Layer::o`.
    O,
    /// `Layer::mlp_norm`.
    MlpNorm,
    /// `Layer::gate`.
    Gate,
    /// `Layer::up`.
    Up,
    /// `Layer::down`.
    Down,
}

/// Where a row's tensor lives: once in the model, or once in every block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slot {
    /// A model-level parameter.
    Model(ModelParam),
    /// A parameter of each block.
    Layer(LayerParam),
}

/// One row of [`PARAMETERS`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Parameter {
    /// The field that holds the tensor.
    pub slot: Slot,
    /// The Hugging Face `LlamaForCausalLM` state-dict name; `{i}` stands for the block index
    /// in per-block rows.
    pub hf_name: &'static str,
    /// The shape, each axis a config size (Linear weights are `[out, in]`).
    pub shape: &'static [Dim],
    /// What the parameter is.
    pub role: Role,
    /// How it is initialised.
    pub init: Init,
    /// The PEFT `target_modules` name, for the projections LoRA can adapt (`None`: LoRA never
    /// adapts it).
    pub peft_module: Option<&'static str>,
}

/// Hugging Face Llama initialisation of embeddings and linear weights (`initializer_range`).
const NORMAL: Init = Init::Normal { std: 0.02 };
const ONES: Init = Init::Ones;

const fn row(
    slot: Slot,
    hf_name: &'static str,
    shape: &'static [Dim],
    role: Role,
    init: Init,
    peft_module: Option<&'static str>,
) -> Parameter {
    Parameter {
        slot,
        hf_name,
        shape,
        role,
        init,
        peft_module,
    }
}

use Dim::{DFf, DKv, DModel, VocabSize};
use LayerParam as L;
use ModelParam as M;
use Role::{AttentionProjection as Attn, Embedding, LmHead, MlpProjection as Mlp, Norm};
use Slot::{Layer, Model};

#[rustfmt::skip]
const TABLE: [Parameter; MODEL_ROWS + LAYER_ROWS] = [
    // slot                  Hugging Face name                                    shape                  role        init     PEFT module
    row(Model(M::Embedding),  "model.embed_tokens.weight",                         &[VocabSize, DModel],  Embedding,  NORMAL,  None),
    row(Layer(L::AttnNorm),   "model.layers.{i}.input_layernorm.weight",           &[DModel],             Norm,       ONES,    None),
    row(Layer(L::Q),          "model.layers.{i}.self_attn.q_proj.weight",          &[DModel, DModel],     Attn,       NORMAL,  Some("q_proj")),
    row(Layer(L::K),          "model.layers.{i}.self_attn.k_proj.weight",          &[DKv, DModel],        Attn,       NORMAL,  Some("k_proj")),
    row(Layer(L::V),          "model.layers.{i}.self_attn.v_proj.weight",          &[DKv, DModel],        Attn,       NORMAL,  Some("v_proj")),
    row(Layer(L::O),          "model.layers.{i}.self_attn.o_proj.weight",          &[DModel, DModel],     Attn,       NORMAL,  Some("o_proj")),
    row(Layer(L::MlpNorm),    "model.layers.{i}.post_attention_layernorm.weight",  &[DModel],             Norm,       ONES,    None),
    row(Layer(L::Gate),       "model.layers.{i}.mlp.gate_proj.weight",             &[DFf, DModel],        Mlp,        NORMAL,  Some("gate_proj")),
    row(Layer(L::Up),         "model.layers.{i}.mlp.up_proj.weight",               &[DFf, DModel],        Mlp,        NORMAL,  Some("up_proj")),
    row(Layer(L::Down),       "model.layers.{i}.mlp.down_proj.weight",             &[DModel, DFf],        Mlp,        NORMAL,  Some("down_proj")),
    row(Model(M::FinalNorm),  "model.norm.weight",                                 &[DModel],             Norm,       ONES,    None),
    row(Model(M::LmHead),     "lm_head.weight",                                    &[VocabSize, DModel],  LmHead,     NORMAL,  None),
];

/// Every parameter, in Hugging Face state-dict order: the model-level rows before the first
/// per-block row come first, then every block's rows (block 0 first), then the remaining
/// model-level rows. [`entries`] expands it for a number of blocks.
pub static PARAMETERS: [Parameter; MODEL_ROWS + LAYER_ROWS] = TABLE;

/// How many per-block rows [`PARAMETERS`] has.
pub const LAYER_ROWS: usize = 9;
/// How many model-level rows [`PARAMETERS`] has.
pub const MODEL_ROWS: usize = 3;

/// The order the code relies on, checked when the crate compiles: the per-block rows are
/// contiguous, and each kind of row appears in the declaration order of its enum
/// ([`ModelParam`], [`LayerParam`]), so that the enum's discriminant is the row's index among
/// its kind.
const fn rows_are_in_declaration_order() -> bool {
    let (mut i, mut model, mut layer, mut after_layers) = (0, 0, 0, false);
    while i < TABLE.len() {
        match TABLE[i].slot {
            Slot::Model(p) => {
                if p as usize != model {
                    return false;
                }
                model += 1;
                after_layers = layer > 0;
            }
            Slot::Layer(p) => {
                if p as usize != layer || after_layers {
                    return false;
                }
                layer += 1;
            }
        }
        i += 1;
    }
    model == MODEL_ROWS && layer == LAYER_ROWS
}
const _: () = assert!(rows_are_in_declaration_order());

impl ModelParam {
    /// The index of this parameter among the model-level rows of [`PARAMETERS`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl LayerParam {
    /// The index of this parameter among the per-block rows of [`PARAMETERS`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The per-block rows, in order (index `i` is the row of the [`LayerParam`] with index `i`).
pub fn layer_rows() -> impl Iterator<Item = &'static Parameter> {
    PARAMETERS
        .iter()
        .filter(|p| matches!(p.slot, Slot::Layer(_)))
}

impl Parameter {
    /// This row's entry in block `layer` (a model-level row ignores `layer`).
    pub fn at(&'static self, layer: usize) -> Entry {
        let place = match self.slot {
            Slot::Model(p) => Place::Model(p),
            Slot::Layer(p) => Place::Layer(layer, p),
        };
        Entry {
            parameter: self,
            place,
        }
    }
}

/// Where one parameter tensor of a model sits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Place {
    /// A model-level parameter.
    Model(ModelParam),
    /// A parameter of block `.0`.
    Layer(usize, LayerParam),
}

/// One parameter tensor of a model with a given number of blocks: a row and where it sits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Entry {
    /// The table row.
    pub parameter: &'static Parameter,
    /// Where the tensor sits.
    pub place: Place,
}

impl Entry {
    /// The Hugging Face name, e.g. `model.layers.3.self_attn.q_proj.weight`.
    pub fn hf_name(&self) -> String {
        match self.place {
            Place::Model(_) => self.parameter.hf_name.to_string(),
            Place::Layer(i, _) => self.parameter.hf_name.replace("{i}", &i.to_string()),
        }
    }

    /// The shape under `config`.
    pub fn shape(&self, config: &TransformerConfig) -> Vec<usize> {
        self.parameter.shape.iter().map(|d| d.of(config)).collect()
    }

    /// The PEFT adapter tensor names of this weight: `base_model.model.<module>.lora_A.weight`
    /// (`A [rank, in]`) and `...lora_B.weight` (`B [out, rank]`), where `<module>` is the Hugging
    /// Face name without `.weight`.
    pub fn peft_lora_names(&self) -> [String; 2] {
        let name = self.hf_name();
        let module = name.strip_suffix(".weight").unwrap_or(&name);
        [
            format!("base_model.model.{module}.lora_A.weight"),
            format!("base_model.model.{module}.lora_B.weight"),
        ]
    }
}

/// Every parameter of a model with `n_layers` blocks, in Hugging Face state-dict order.
pub fn entries(n_layers: usize) -> impl Iterator<Item = Entry> {
    let first_layer_row = PARAMETERS
        .iter()
        .position(|p| matches!(p.slot, Slot::Layer(_)))
        .unwrap_or(PARAMETERS.len());
    let model_rows = |rows: &'static [Parameter]| {
        rows.iter()
            .filter(|p| matches!(p.slot, Slot::Model(_)))
            .map(|p| p.at(0))
    };
    let layers = (0..n_layers).flat_map(|i| layer_rows().map(move |p| p.at(i)));
    model_rows(&PARAMETERS[..first_layer_row])
        .chain(layers)
        .chain(model_rows(&PARAMETERS[first_layer_row..]))
}

/// Every parameter tensor of a model of `config`, in Hugging Face state-dict order: the rows of
/// [`entries`] for `config.n_layers` blocks, without `lm_head.weight` when
/// `config.tie_word_embeddings` (the LM head then reads `model.embed_tokens.weight`, as in
/// Hugging Face, whose tied state dicts hold the matrix once).
pub fn entries_for(config: &TransformerConfig) -> impl Iterator<Item = Entry> {
    let tied = config.tie_word_embeddings;
    entries(config.n_layers).filter(move |e| !(tied && e.place == Place::Model(ModelParam::LmHead)))
}

/// The PEFT `target_modules` names of a role's projections, in table order (empty for roles LoRA
/// never adapts).
pub fn peft_modules(role: Role) -> Vec<&'static str> {
    PARAMETERS
        .iter()
        .filter(|p| p.role == role)
        .filter_map(|p| p.peft_module)
        .collect()
}

/// The LoRA target groups: the roles LoRA can adapt, each a field of [`LoraTargets`], with the
/// name of that field and the bit of the C ABI's `rt_lora_target` mask.
pub static LORA_TARGET_GROUPS: [OptionRow<Role>; 2] = [
    OptionRow {
        value: Role::AttentionProjection,
        name: "attention",
        c_value: 1,
        c_name: "RT_LORA_TARGET_ATTENTION",
        description: "the q, k, v and o projections",
    },
    OptionRow {
        value: Role::MlpProjection,
        name: "mlp",
        c_value: 2,
        c_name: "RT_LORA_TARGET_MLP",
        description: "the gate, up and down projections of the MLP",
    },
];

/// PEFT `target_modules` of adapters on the groups `targets` selects, in table order.
pub fn target_modules(targets: &LoraTargets) -> Vec<&'static str> {
    PARAMETERS
        .iter()
        .filter(|p| p.role.targeted_by(targets))
        .filter_map(|p| p.peft_module)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_rows_are_indexed_by_their_enum() {
        let rows: Vec<_> = layer_rows().collect();
        assert_eq!(rows.len(), LAYER_ROWS);
        for (i, p) in rows.iter().enumerate() {
            let Slot::Layer(l) = p.slot else {
                panic!("{p:?}")
            };
            assert_eq!(l.index(), i, "{p:?}");
            assert!(p.hf_name.starts_with("model.layers.{i}."), "{p:?}");
        }
        for p in PARAMETERS.iter() {
            assert_eq!(
                matches!(p.slot, Slot::Model(_)),
                !p.hf_name.contains("{i}"),
                "{p:?}"
            );
        }
    }

    #[test]
    fn exactly_the_projections_are_lora_targets_with_their_peft_names() {
        for p in PARAMETERS.iter() {
            let projection = LORA_TARGET_GROUPS.iter().any(|g| g.value == p.role);
            assert_eq!(p.peft_module.is_some(), projection, "{p:?}");
            if let Some(m) = p.peft_module {
                assert!(p.hf_name.ends_with(&format!(".{m}.weight")), "{p:?}");
                assert_eq!(p.shape.len(), 2, "{p:?}");
            }
            assert_eq!(p.init == Init::Ones, p.role == Role::Norm, "{p:?}");
        }
    }
}
