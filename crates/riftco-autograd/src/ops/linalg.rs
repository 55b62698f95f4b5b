//! Matrix products: `linear` (x·Wᵀ, Hugging Face weight layout), 2-D `matmul`, batched `bmm`.

use super::{activation, buf, evaluate_value, gradient, output_shape};
use crate::error::Result;
use crate::variable::Variable;
use riftco_kernels::{batched_matmul, matmul as gemm, MatmulSpec};
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
/// [graph-only variants](crate::ops#graph-only-variants)). While a graph is recorded the returned value is unspecified (NaN in debug builds), not `x · Wᵀ`; the VJP is `linear`'s (it reads `x` and
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
    let out = if evaluate_value(evaluate, &[x, w]) {
        let mut out = buf("linear", shape.numel())?;
        gemm(
            MatmulSpec::new(m, in_f, out_f).trans_b(true),
            &x.value().read(),
            &w.value().read(),
            &mut out,
        );
        out
    } else {
        // Never read (graph-only): an unfilled pooled buffer, not zeroed.
        buf("linear", shape.numel())?
    };
    let value = activation(out, shape);
    Ok(Variable::from_op(
        "linear",
        value,
        vec![x.clone(), w.clone()],
        move |p, _, g| {
            let gr = g.read();
            // dx and dW have the shapes of x and W (valid shapes).
            let dx = p[0]
                .requires_grad()
                .then(|| -> Result<_> {
                    let mut d = buf("linear (vjp)", p[0].value().numel())?;
                    gemm(
                        MatmulSpec::new(m, out_f, in_f),
                        &gr,
                        &p[1].value().read(),
                        &mut d,
                    );
                    Ok(gradient(d, p[0].value().shape().clone()))
                })
                .transpose()?;
            let dw = p[1]
                .requires_grad()
                .then(|| -> Result<_> {
                    let mut d = buf("linear (vjp)", p[1].value().numel())?;
                    gemm(
                        MatmulSpec::new(out_f, m, in_f).trans_a(true),
                        &gr,
                        &p[0].value().read(),
                        &mut d,
                    );
                    Ok(gradient(d, [out_f, in_f]))
                })
                .transpose()?;
            Ok(vec![dx, dw])
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
    let mut out = buf("matmul", shape.numel())?;
    gemm(
        MatmulSpec::new(m, k, n),
        &a.value().read(),
        &b.value().read(),
        &mut out,
    );
    let value = activation(out, shape);
    Ok(Variable::from_op(
        "matmul",
        value,
        vec![a.clone(), b.clone()],
        move |p, _, g| {
            let gr = g.read();
            let da = p[0]
                .requires_grad()
                .then(|| -> Result<_> {
                    let mut d = buf("matmul (vjp)", m * k)?;
                    gemm(
                        MatmulSpec::new(m, n, k).trans_b(true),
                        &gr,
                        &p[1].value().read(),
                        &mut d,
                    );
                    Ok(gradient(d, [m, k]))
                })
                .transpose()?;
            let db = p[1]
                .requires_grad()
                .then(|| -> Result<_> {
                    let mut d = buf("matmul (vjp)", k * n)?;
                    gemm(
                        MatmulSpec::new(k, m, n).trans_a(true),
                        &p[0].value().read(),
                        &gr,
                        &mut d,
                    );
                    Ok(gradient(d, [k, n]))
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
    let mut out = buf("bmm", shape.numel())?;
    batched_matmul(
        batch,
        MatmulSpec::new(m, k, n).trans_b(trans_b),
        &a.value().read(),
        &b.value().read(),
        &mut out,
    );
    let value = activation(out, shape);
    Ok(Variable::from_op(
        "bmm",
        value,
        vec![a.clone(), b.clone()],
        move |p, _, g| {
            let gr = g.read();
            let da = p[0]
                .requires_grad()
                .then(|| -> Result<_> {
                    let mut d = buf("bmm (vjp)", p[0].value().numel())?;
                    // dA[m,k] = dC[m,n] · op(B)ᵀ
                    batched_matmul(
                        batch,
                        MatmulSpec::new(m, n, k).trans_b(!trans_b),
                        &gr,
                        &p[1].value().read(),
                        &mut d,
                    );
                    Ok(gradient(d, p[0].value().shape().clone()))
                })
                .transpose()?;
            let db = p[1]
                .requires_grad()
                .then(|| -> Result<_> {
                    let mut d = buf("bmm (vjp)", p[1].value().numel())?;
                    if trans_b {
                        // dB[n,k] = dC[m,n]ᵀ · A[m,k]
                        batched_matmul(
                            batch,
                            MatmulSpec::new(n, m, k).trans_a(true),
                            &gr,
                            &p[0].value().read(),
                            &mut d,
                        );
                    } else {
                        // dB[k,n] = A[m,k]ᵀ · dC[m,n]
                        batched_matmul(
                            batch,
                            MatmulSpec::new(k, m, n).trans_a(true),
                            &p[0].value().read(),
                            &gr,
                            &mut d,
                        );
                    }
                    Ok(gradient(d, p[1].value().shape().clone()))
                })
                .transpose()?;
            Ok(vec![da, db])
        },
    ))
}
