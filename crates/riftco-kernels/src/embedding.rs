//! Embedding gather and its scatter-add VJP.

/// `out[i, :] = table[ids[i], :]`, table `[vocab, d]`, out `[ids.len(), d]`.
///
/// # Panics
/// When an id is out of range or lengths disagree (callers validate first).
pub fn embedding(table: &[f32], d: usize, ids: &[u32], out: &mut [f32]) {
    assert!(d > 0 && table.len() % d == 0, "embedding: table layout");
    assert_eq!(out.len(), ids.len() * d, "embedding: output length");
    let vocab = table.len() / d;
    for (o, &id) in out.chunks_exact_mut(d).zip(ids) {
        let id = id as usize;
        assert!(id < vocab, "embedding: id out of range");
        o.copy_from_slice(&table[id * d..(id + 1) * d]);
    }
}

/// `dtable[ids[i], :] += dy[i, :]`, in index order (deterministic).
pub fn embedding_backward(ids: &[u32], dy: &[f32], d: usize, dtable: &mut [f32]) {
    assert_eq!(dy.len(), ids.len() * d, "embedding_backward: dy length");
    assert!(
        d > 0 && dtable.len() % d == 0,
        "embedding_backward: table layout"
    );
    for (g, &id) in dy.chunks_exact(d).zip(ids) {
        let id = id as usize;
        crate::elementwise::add_assign(&mut dtable[id * d..(id + 1) * d], g);
    }
}
