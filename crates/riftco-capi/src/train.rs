//! Training: loss graphs, the one-call training step, graph statistics, Adam.

use crate::error::{err, guard, guard_void, in_ptr, in_slice, out_ptr, rt_status, Result};
use crate::model::rt_model;
use riftco_autograd::{BackwardOptions, GraphStatistics, Variable};
use riftco_transformer::{Adam, DecoderOnlyTransformer};
use std::sync::{Arc, Mutex, PoisonError};

/// Structural statistics of a training graph (`Variable::graph_statistics`): reachable nodes and
/// the tensor elements (values and gradients) they own. Not a process-memory profile: backend
/// workspaces and tensors captured by backward closures are excluded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct rt_graph_statistics {
    /// Graph nodes reachable from the loss, itself included.
    pub node_count: u64,
    /// Elements of the values and gradients owned by those nodes.
    pub element_count: u64,
}

impl From<GraphStatistics> for rt_graph_statistics {
    fn from(s: GraphStatistics) -> Self {
        Self {
            node_count: s.node_count as u64,
            element_count: s.element_count as u64,
        }
    }
}

/// An opaque, reference-counted training graph: a scalar loss and everything it needs for
/// backward. It shares the model's weights, so it stays valid after rt_model_free. Created by
/// rt_model_loss, released with rt_graph_free.
pub struct rt_graph {
    inner: Arc<Variable>,
}

/// An opaque, reference-counted Adam optimizer over the parameters that were trainable when it
/// was created. Created by rt_adam_create, released with rt_adam_free.
pub struct rt_adam {
    pub(crate) inner: Arc<Mutex<Adam>>,
}

/// Validates a `[batch, seq + 1]` token block and records its loss graph.
fn loss(
    model: &DecoderOnlyTransformer,
    tokens: &[u32],
    batch: usize,
    seq_plus_one: usize,
) -> Result<Variable> {
    check_block(model, tokens, batch, seq_plus_one)?;
    Ok(model.loss(tokens, batch, seq_plus_one)?)
}

/// The layout checks of a token block `[batch, seq + 1]`, with the C ABI's statuses.
fn check_block(
    model: &DecoderOnlyTransformer,
    tokens: &[u32],
    batch: usize,
    seq_plus_one: usize,
) -> Result<()> {
    if batch == 0 || seq_plus_one < 2 {
        return Err(err(
            rt_status::RT_ERROR_SHAPE,
            format!("a token block [batch {batch}, seq + 1 = {seq_plus_one}] needs batch >= 1 and seq + 1 >= 2"),
        ));
    }
    let expected = batch.checked_mul(seq_plus_one).ok_or_else(|| {
        err(
            rt_status::RT_ERROR_SHAPE,
            format!("batch {batch} * (seq + 1) {seq_plus_one} overflows"),
        )
    })?;
    if tokens.len() != expected {
        return Err(err(
            rt_status::RT_ERROR_SHAPE,
            format!(
                "tokens_len {} does not match [batch {batch}, seq + 1 = {seq_plus_one}] \
                 ({expected} tokens expected)",
                tokens.len()
            ),
        ));
    }
    let max = model.config().max_seq_len;
    if seq_plus_one - 1 > max {
        return Err(err(
            rt_status::RT_ERROR_SHAPE,
            format!("seq = {} exceeds max_seq_len {max}", seq_plus_one - 1),
        ));
    }
    Ok(())
}

fn item(loss: &Variable) -> Result<f32> {
    loss.value()
        .item()
        .map_err(|e| err(rt_status::RT_ERROR_INTERNAL, e.to_string()))
}

/// One training step's gradient computation: the mean next-token cross-entropy of the token
/// block `tokens` `[batch, seq_plus_one]` (row-major, `tokens_len == batch * seq_plus_one`;
/// inputs are the first `seq` columns, targets the last `seq`), then backward, which replaces the
/// gradients of every trainable parameter. Writes the loss to `*loss_out`; the graph's
/// statistics become rt_model_last_graph_statistics. Apply the update with rt_adam_step.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_SHAPE (lengths, `seq > max_seq_len`),
/// RT_ERROR_INVALID_ARGUMENT (a token id >= vocab_size, named with its index).
#[no_mangle]
pub unsafe extern "C" fn rt_model_train_step(
    model: *mut rt_model,
    tokens: *const u32,
    tokens_len: usize,
    batch: usize,
    seq_plus_one: usize,
    loss_out: *mut f32,
) -> rt_status {
    guard("rt_model_train_step", || {
        let loss_out = out_ptr(loss_out, "loss_out")?;
        let model = in_ptr(model, "model")?;
        let tokens = in_slice(tokens, tokens_len, "tokens")?;
        let mut state = model.lock();
        let l = loss(&state.model, tokens, batch, seq_plus_one)?;
        state.last_graph = Some(l.graph_statistics());
        drop(state);
        // The graph goes with this call: free each node's values as soon as its VJP ran.
        l.backward_with(BackwardOptions::freeing())?;
        *loss_out = item(&l)?;
        Ok(())
    })
}

/// Statistics of the graph of the last loss computed with rt_model_train_step or rt_model_loss
/// on this model (measured after the forward, before backward).
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_STATE (no loss computed yet).
#[no_mangle]
pub unsafe extern "C" fn rt_model_last_graph_statistics(
    model: *const rt_model,
    out: *mut rt_graph_statistics,
) -> rt_status {
    guard("rt_model_last_graph_statistics", || {
        let out = out_ptr(out, "out")?;
        let model = in_ptr(model, "model")?;
        let stats = model.lock().last_graph.ok_or_else(|| {
            err(
                rt_status::RT_ERROR_INVALID_STATE,
                "no loss has been computed on this model yet",
            )
        })?;
        *out = stats.into();
        Ok(())
    })
}

/// Records the loss graph of a token block (see rt_model_train_step for the layout) without
/// running backward. `*out` receives a new graph handle owned by the caller (NULL on failure).
///
/// Errors: as rt_model_train_step.
#[no_mangle]
pub unsafe extern "C" fn rt_model_loss(
    model: *mut rt_model,
    tokens: *const u32,
    tokens_len: usize,
    batch: usize,
    seq_plus_one: usize,
    out: *mut *mut rt_graph,
) -> rt_status {
    guard("rt_model_loss", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let model = in_ptr(model, "model")?;
        let tokens = in_slice(tokens, tokens_len, "tokens")?;
        let mut state = model.lock();
        let l = loss(&state.model, tokens, batch, seq_plus_one)?;
        state.last_graph = Some(l.graph_statistics());
        *out = Box::into_raw(Box::new(rt_graph { inner: Arc::new(l) }));
        Ok(())
    })
}

/// rt_model_loss with targets from `labels` (`labels_len` = `tokens_len` int64 values, row-major
/// `[batch, seq + 1]` like the tokens; Hugging Face's convention, shifted inside the loss: the
/// prediction after `tokens[b][t]` is scored against `labels[b][t + 1]`), where
/// RT_IGNORE_INDEX (-100) marks a position that is not a target (a prompt token in instruction
/// tuning, padding). The mean is over the targeted positions only; ignored ones contribute
/// nothing to the loss or the gradients. Since 2.9.
///
/// Errors: as rt_model_loss; RT_ERROR_SHAPE when `labels_len` differs from `tokens_len`;
/// RT_ERROR_INVALID_ARGUMENT for a label that is neither -100 nor an id below vocab_size (named
/// with its index), or labels that ignore every target position.
#[no_mangle]
pub unsafe extern "C" fn rt_model_loss_with_labels(
    model: *mut rt_model,
    tokens: *const u32,
    tokens_len: usize,
    labels: *const i64,
    labels_len: usize,
    batch: usize,
    seq_plus_one: usize,
    out: *mut *mut rt_graph,
) -> rt_status {
    guard("rt_model_loss_with_labels", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let model = in_ptr(model, "model")?;
        let tokens = in_slice(tokens, tokens_len, "tokens")?;
        let labels = in_slice(labels, labels_len, "labels")?;
        if labels.len() != tokens.len() {
            return Err(err(
                rt_status::RT_ERROR_SHAPE,
                format!(
                    "labels_len {} differs from tokens_len {}: labels are aligned with the tokens",
                    labels.len(),
                    tokens.len()
                ),
            ));
        }
        let mut state = model.lock();
        // The block's own checks (layout, max_seq_len), then the labels'.
        check_block(&state.model, tokens, batch, seq_plus_one)?;
        let l = state
            .model
            .loss_with_labels(tokens, labels, batch, seq_plus_one)?;
        state.last_graph = Some(l.graph_statistics());
        *out = Box::into_raw(Box::new(rt_graph { inner: Arc::new(l) }));
        Ok(())
    })
}

/// The loss of a packed batch: several examples per row of `tokens [batch, seq + 1]`, delimited
/// by `position_ids` (`position_ids_len` = `tokens_len` int64 values, row-major like the tokens;
/// Hugging Face's padding-free convention): each row counts 0, 1, 2, .. within an example and
/// restarts at 0 where the next one starts. Every example is computed as if alone (RoPE
/// restarts at 0, attention stays within the example), the target at an example's first token
/// is never scored, and the mean is over every scored target of the batch. Targets come from
/// `labels` as in rt_model_loss_with_labels, or from the tokens when `labels` is NULL (then
/// `labels_len` must be 0). Since 2.10.
///
/// Errors: as rt_model_loss_with_labels; RT_ERROR_SHAPE when `position_ids_len` (or a given
/// `labels_len`) differs from `tokens_len`; RT_ERROR_INVALID_ARGUMENT for a position that is
/// neither 0 nor the previous one + 1 (named with its `[row, column]`).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn rt_model_loss_packed(
    model: *mut rt_model,
    tokens: *const u32,
    tokens_len: usize,
    labels: *const i64,
    labels_len: usize,
    position_ids: *const i64,
    position_ids_len: usize,
    batch: usize,
    seq_plus_one: usize,
    out: *mut *mut rt_graph,
) -> rt_status {
    guard("rt_model_loss_packed", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let model = in_ptr(model, "model")?;
        let tokens = in_slice(tokens, tokens_len, "tokens")?;
        let labels = if labels.is_null() && labels_len == 0 {
            None
        } else {
            Some(in_slice(labels, labels_len, "labels")?)
        };
        let positions = in_slice(position_ids, position_ids_len, "position_ids")?;
        for (what, len) in [
            ("labels_len", labels.map(<[i64]>::len)),
            ("position_ids_len", Some(positions.len())),
        ] {
            if let Some(len) = len.filter(|&n| n != tokens.len()) {
                return Err(err(
                    rt_status::RT_ERROR_SHAPE,
                    format!(
                        "{what} {len} differs from tokens_len {}: it is aligned with the tokens",
                        tokens.len()
                    ),
                ));
            }
        }
        let mut state = model.lock();
        check_block(&state.model, tokens, batch, seq_plus_one)?;
        let l = state
            .model
            .loss_packed(tokens, labels, positions, batch, seq_plus_one)?;
        state.last_graph = Some(l.graph_statistics());
        *out = Box::into_raw(Box::new(rt_graph { inner: Arc::new(l) }));
        Ok(())
    })
}

/// Writes the graph's loss value.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_graph_loss(graph: *const rt_graph, out: *mut f32) -> rt_status {
    guard("rt_graph_loss", || {
        let out = out_ptr(out, "out")?;
        *out = item(&in_ptr(graph, "graph")?.inner)?;
        Ok(())
    })
}

/// Backpropagates from the graph's loss, replacing the gradients of the parameters it reached.
/// May be called again (same gradients) until a value it read changes.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_STALE_GRAPH (a parameter changed since the forward,
/// e.g. by rt_adam_step; gradients are left unchanged).
#[no_mangle]
pub unsafe extern "C" fn rt_graph_backward(graph: *const rt_graph) -> rt_status {
    guard("rt_graph_backward", || {
        in_ptr(graph, "graph")?.inner.backward()?;
        Ok(())
    })
}

/// Backpropagates from the graph's loss like rt_graph_backward; with `retain_graph` false each
/// node's saved values are freed as soon as its VJP ran (PyTorch's `retain_graph=False`: the
/// pass peaks lower), and a later backward of this graph fails with RT_ERROR_INVALID_STATE
/// (the message names the node; compute the loss again). `retain_graph` true is
/// rt_graph_backward. Since 2.7.
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_STALE_GRAPH (gradients are left unchanged),
/// RT_ERROR_INVALID_STATE (an earlier freeing backward already differentiated this graph).
#[no_mangle]
pub unsafe extern "C" fn rt_graph_backward_ex(
    graph: *const rt_graph,
    retain_graph: bool,
) -> rt_status {
    guard("rt_graph_backward_ex", || {
        in_ptr(graph, "graph")?
            .inner
            .backward_with(BackwardOptions {
                retain_graph,
                ..BackwardOptions::default()
            })?;
        Ok(())
    })
}

/// Writes the graph's structural statistics (they include gradients once backward has run).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_graph_get_statistics(
    graph: *const rt_graph,
    out: *mut rt_graph_statistics,
) -> rt_status {
    guard("rt_graph_get_statistics", || {
        let out = out_ptr(out, "out")?;
        *out = in_ptr(graph, "graph")?.inner.graph_statistics().into();
        Ok(())
    })
}

/// Releases a graph handle. NULL is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn rt_graph_free(graph: *mut rt_graph) {
    guard_void(|| {
        if !graph.is_null() {
            // SAFETY: a handle from this library, freed once (caller contract).
            drop(unsafe { Box::from_raw(graph) });
        }
    })
}

/// Creates an Adam optimizer (beta1 0.9, beta2 0.999, eps 1e-8, no weight decay) over the
/// model's currently trainable parameters (the LoRA adapters when LoRA is enabled, otherwise
/// every weight). `*out` receives a new handle owned by the caller (NULL on failure).
///
/// Errors: RT_ERROR_NULL_POINTER, RT_ERROR_INVALID_ARGUMENT (`lr` not positive and finite).
#[no_mangle]
pub unsafe extern "C" fn rt_adam_create(
    model: *const rt_model,
    lr: f32,
    out: *mut *mut rt_adam,
) -> rt_status {
    guard("rt_adam_create", || {
        let out = out_ptr(out, "out")?;
        *out = std::ptr::null_mut();
        let model = in_ptr(model, "model")?;
        let params = model.lock().model.trainable_parameters();
        let adam = Adam::new(params, lr)?;
        *out = Box::into_raw(Box::new(rt_adam {
            inner: Arc::new(Mutex::new(adam)),
        }));
        Ok(())
    })
}

/// One Adam update of every parameter that has a gradient (per-parameter step counts, as in
/// PyTorch). When no parameter has a gradient (before the first rt_model_train_step, or for an
/// optimizer created before rt_model_enable_lora) nothing changes and the step is not counted.
/// Graphs recorded before an update become stale (rt_graph_backward returns
/// RT_ERROR_STALE_GRAPH).
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_adam_step(adam: *mut rt_adam) -> rt_status {
    guard("rt_adam_step", || {
        let adam = in_ptr(adam, "adam")?;
        adam.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .step()?;
        Ok(())
    })
}

/// Writes the number of steps taken: rt_adam_step calls that updated at least one parameter.
///
/// Errors: RT_ERROR_NULL_POINTER.
#[no_mangle]
pub unsafe extern "C" fn rt_adam_steps(adam: *const rt_adam, out: *mut u64) -> rt_status {
    guard("rt_adam_steps", || {
        let out = out_ptr(out, "out")?;
        let adam = in_ptr(adam, "adam")?;
        *out = adam
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .steps();
        Ok(())
    })
}

/// Releases an optimizer handle. NULL is accepted and ignored.
#[no_mangle]
pub unsafe extern "C" fn rt_adam_free(adam: *mut rt_adam) {
    guard_void(|| {
        if !adam.is_null() {
            // SAFETY: a handle from this library, freed once (caller contract).
            drop(unsafe { Box::from_raw(adam) });
        }
    })
}
