//! Matrix products: `linear` (x·Wᵀ, Hugging Face weight layout), 2-D `matmul`, batched `bmm`.

use super::{backend, evaluate_value, output_shape, placeholder, ACT, GRAD};
use crate::error::Result;
use crate::variable::{Saves, Variable};
use riftco_tensor::backend::MatmulSpec;
use riftco_tensor::TensorError;

/// `y[..., out] = x[..., in] · Wᵀ` with `W` stored `[out, in]` (PyTorch `nn.Linear` without bias).
///
/// VJP: `dx = dy · W`, `dW = dyᵀ · x` (the latter only when `W` requires grad: frozen weights
/// cost no weight-gradient work).
///
/// # Errors
/// Shape errors when `W` is not 2-D or its `in` differs from `x`'s last dimension.
pub fn linear(x: &Variable, w: &Variable) -> Result<Variable> {
    linear_impl(x, w, true)
}

/// [`linear`] recorded for its VJP only (see the
/// [graph-only variants](crate::ops#graph-only-variants)). While a graph is recorded the returned value holds no data (a placeholder: reading it is an error), not `x · Wᵀ`; the VJP is `linear`'s (it reads `x` and
/// `W`, never the output).
///
/// # Errors
/// As [`linear`].
pub fn linear_graph_only(x: &Variable, w: &Variable) -> Result<Variable> {
    linear_impl(x, w, false)
}

fn linear_impl(x: &Variable, w: &Variable, evaluate: bool) -> Result<Variable> {
    let wd = w.dims();
    if wd.len() != 2 {
        return Err(TensorError::RankMismatch {
            op: "linear (weight)",
            expected: 2,
            got: wd.to_vec(),
        }
        .into());
    }
    let (out_f, in_f) = (wd[0], wd[1]);
    let xd = x.dims();
    if xd.is_empty() || *xd.last().unwrap() != in_f {
        return Err(TensorError::ShapeMismatch {
            op: "linear (input last dim vs weight [out, in])",
            expected: vec![in_f],
            got: xd.to_vec(),
        }
        .into());
    }
    // Rows: the product of x's leading dimensions (not numel / in, which is 0 when in is 0).
    // x's shape is valid, so the product of its leading dimensions cannot wrap.
    let m: usize = xd[..xd.len() - 1].iter().product();
    let mut shape = xd.to_vec();
    *shape.last_mut().unwrap() = out_f;
    let shape = output_shape("linear", shape)?;
    let be = backend("linear", &[x, w])?;
    let value = if evaluate_value(evaluate, &[x, w]) {
        let spec = MatmulSpec::new(m, in_f, out_f).trans_b(true);
        be.matmul("linear", spec, x.value(), w.value(), shape, ACT)?
    } else {
        // Never read (graph-only): a placeholder without memory.
        placeholder(be, shape)?
    };
    Ok(Variable::from_op_saving(
        "linear",
        value,
        vec![x.clone(), w.clone()],
        Saves::parents(&[0, 1]),
        move |p, _, g| {
            let (dx, dw) = linear_vjp(be, (m, in_f, out_f), p, g)?;
            Ok(vec![dx, dw])
        },
    ))
}

/// The VJP of `x · Wᵀ` for the parents `p = [x, W, ..]`: `dx = g · W` and `dW = gᵀ · x`, each
/// only when that parent requires grad (shapes of x and W: valid shapes).
fn linear_vjp(
    be: &'static dyn riftco_tensor::Backend,
    (m, in_f, out_f): (usize, usize, usize),
    p: &[Variable],
    g: &riftco_tensor::Tensor,
) -> Result<(Option<riftco_tensor::Tensor>, Option<riftco_tensor::Tensor>)> {
    let dx = p[0]
        .requires_grad()
        .then(|| {
            let spec = MatmulSpec::new(m, out_f, in_f);
            let shape = p[0].value().shape().clone();
            be.matmul("linear (vjp)", spec, g, p[1].value(), shape, GRAD)
        })
        .transpose()?;
    let dw = p[1]
        .requires_grad()
        .then(|| {
            let spec = MatmulSpec::new(out_f, m, in_f).trans_a(true);
            let shape = [out_f, in_f].into();
            be.matmul("linear (vjp)", spec, g, p[0].value(), shape, GRAD)
        })
        .transpose()?;
    Ok((dx, dw))
}

/// `y[..., out] = x[..., in] · Wᵀ + b` with `W` stored `[out, in]` and `b` `[out]` (PyTorch
/// `nn.Linear`), recorded as ONE node: the graph keeps `y` only, not the product before the
/// bias is added (which no VJP reads), so a layer with bias retains the bytes of one output.
/// Values and gradients are bitwise those of [`linear`] followed by
/// [`crate::ops::broadcast_add`] (the same kernels in the same order).
///
/// VJP: `dx = dy · W`, `dW = dyᵀ · x`, `db = Σ dy` over the leading axes.
///
/// # Errors
/// As [`linear`]; [`TensorError::ShapeMismatch`] when `b` is not `[out]`.
pub fn linear_bias(x: &Variable, w: &Variable, b: &Variable) -> Result<Variable> {
    let out_f = w.dims().first().copied().unwrap_or(0);
    if b.dims() != [out_f] || w.dims().len() != 2 {
        return Err(TensorError::ShapeMismatch {
            op: "linear (bias vs weight [out, in])",
            expected: vec![out_f],
            got: b.dims().to_vec(),
        }
        .into());
    }
    let product = crate::grad_mode::no_grad(|| linear(x, w))?;
    let be = backend("linear", &[x, w, b])?;
    let shape = product.value().shape().clone();
    let value = be.binary(
        "linear (bias)",
        riftco_tensor::backend::BinaryOp::Add,
        product.value(),
        b.value(),
        shape,
        ACT,
    )?;
    drop(product);
    let in_f = w.dims()[1];
    let m: usize = x.dims()[..x.dims().len() - 1].iter().product();
    Ok(Variable::from_op_saving(
        "linear",
        value,
        vec![x.clone(), w.clone(), b.clone()],
        Saves::parents(&[0, 1]),
        move |p, _, g| {
            let (dx, dw) = linear_vjp(be, (m, in_f, out_f), p, g)?;
            let db = p[2]
                .requires_grad()
                .then(|| super::broadcast::reduce_to(be, "linear (vjp)", g, &[out_f], GRAD))
                .transpose()?;
            Ok(vec![dx, dw, db])
        },
    ))
}

/// `C[m, n] = A[m, k] · B[k, n]`. VJP: `dA = dC · Bᵀ`, `dB = Aᵀ · dC`.
///
/// # Errors
/// Shape errors when operands are not 2-D or inner dimensions differ.
pub fn matmul(a: &Variable, b: &Variable) -> Result<Variable> {
    let (ad, bd) = (a.dims(), b.dims());
    if ad.len() != 2 || bd.len() != 2 {
        return Err(TensorError::RankMismatch {
            op: "matmul",
            expected: 2,
            got: if ad.len() != 2 {
                ad.to_vec()
            } else {
                bd.to_vec()
            },
        }
        .into());
    }
    let (m, k, n) = (ad[0], ad[1], bd[1]);
    if bd[0] != k {
        return Err(TensorError::ShapeMismatch {
            op: "matmul (inner dimensions)",
            expected: vec![k, n],
            got: bd.to_vec(),
        }
        .into());
    }
    let shape = output_shape("matmul", [m, n])?;
    let be = backend("matmul", &[a, b])?;
    let value = be.matmul(
        "matmul",
        MatmulSpec::new(m, k, n),
        a.value(),
        b.value(),
        shape,
        ACT,
    )?;
    Ok(Variable::from_op_saving(
        "matmul",
        value,
        vec![a.clone(), b.clone()],
        Saves::parents(&[0, 1]),
        move |p, _, g| {
            let da = p[0]
                .requires_grad()
                .then(|| {
                    let spec = MatmulSpec::new(m, n, k).trans_b(true);
                    be.matmul("matmul (vjp)", spec, g, p[1].value(), [m, k].into(), GRAD)
                })
                .transpose()?;
            let db = p[1]
                .requires_grad()
                .then(|| {
                    let spec = MatmulSpec::new(k, m, n).trans_a(true);
                    be.matmul("matmul (vjp)", spec, p[0].value(), g, [k, n].into(), GRAD)
                })
                .transpose()?;
            Ok(vec![da, db])
        },
    ))
}

/// Batched product over the leading axes: `C[..., m, n] = A[..., m, k] · op(B)`, where
/// `op(B) = B[..., k, n]` or, with `trans_b`, `B[..., n, k]ᵀ`. Leading axes must match.
///
/// VJP (`trans_b = false`): `dA = dC · Bᵀ`, `dB = Aᵀ · dC`; (`trans_b = true`): `dA = dC · B`,
/// `dB = dCᵀ · A`.
///
/// # Errors
/// Shape errors on rank < 3, differing batch axes or inner dimensions.
pub fn bmm(a: &Variable, b: &Variable, trans_b: bool) -> Result<Variable> {
    let (ad, bd) = (a.dims().to_vec(), b.dims().to_vec());
    if ad.len() < 3 || bd.len() != ad.len() || ad[..ad.len() - 2] != bd[..bd.len() - 2] {
        return Err(TensorError::ShapeMismatch {
            op: "bmm (batch axes)",
            expected: ad.clone(),
            got: bd,
        }
        .into());
    }
    let r = ad.len();
    let batch: usize = ad[..r - 2].iter().product();
    let (m, k) = (ad[r - 2], ad[r - 1]);
    let (bk, n) = if trans_b {
        (bd[r - 1], bd[r - 2])
    } else {
        (bd[r - 2], bd[r - 1])
    };
    if bk != k {
        return Err(TensorError::ShapeMismatch {
            op: "bmm (inner dimensions)",
            expected: ad,
            got: bd,
        }
        .into());
    }
    let mut shape = ad[..r - 2].to_vec();
    shape.extend([m, n]);
    let shape = output_shape("bmm", shape)?;
    let be = backend("bmm", &[a, b])?;
    let spec = MatmulSpec::new(m, k, n).trans_b(trans_b);
    let value = be.batched_matmul("bmm", batch, spec, a.value(), b.value(), shape, ACT)?;
    Ok(Variable::from_op_saving(
        "bmm",
        value,
        vec![a.clone(), b.clone()],
        Saves::parents(&[0, 1]),
        move |p, _, g| {
            let (a, b) = (p[0].value(), p[1].value());
            let da = p[0]
                .requires_grad()
                .then(|| {
                    // dA[m,k] = dC[m,n] · op(B)ᵀ
                    let spec = MatmulSpec::new(m, n, k).trans_b(!trans_b);
                    be.batched_matmul("bmm (vjp)", batch, spec, g, b, a.shape().clone(), GRAD)
                })
                .transpose()?;
            let db = p[1]
                .requires_grad()
                .then(|| {
                    let shape = b.shape().clone();
                    if trans_b {
                        // dB[n,k] = dC[m,n]ᵀ · A[m,k]
                        let spec = MatmulSpec::new(n, m, k).trans_a(true);
                        be.batched_matmul("bmm (vjp)", batch, spec, g, a, shape, GRAD)
                    } else {
                        // dB[k,n] = A[m,k]ᵀ · dC[m,n]
                        let spec = MatmulSpec::new(k, m, n).trans_a(true);
                        be.batched_matmul("bmm (vjp)", batch, spec, a, g, shape, GRAD)
                    }
                })
                .transpose()?;
            Ok(vec![da, db])
        },
    ))
}
