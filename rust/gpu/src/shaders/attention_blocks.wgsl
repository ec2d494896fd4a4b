// What attention (`attention.wgsl`) and the merge of its blocks
// (`attention_merge.wgsl`) share: the blocks of positions a query sees,
// and how a block's sums fold into the query's. A query's output depends
// only on its position and the cache, not on the pass it came in: its
// positions are met in blocks of BLOCK_POSITIONS counted from position 0
// (the same blocks for every query), each block's scores softmaxed from
// the block's own maximum, and the blocks folded into the total one after
// another, in order, whether one workgroup walks them all or each block's
// sums come from a workgroup of its own and the merge folds them.

const BLOCK_POSITIONS: u32 = 64u;

// The first position a query at `pos` sees (a window of 0: no window).
fn first_seen(pos: u32, window: u32) -> u32 {
    if (window > 0u && pos + 1u > window) {
        return pos + 1u - window;
    }
    return 0u;
}

// How many blocks a query at `pos` sees: from the one holding its first
// position to the one holding `pos`.
fn blocks_seen(pos: u32, window: u32) -> u32 {
    return pos / BLOCK_POSITIONS - first_seen(pos, window) / BLOCK_POSITIONS + 1u;
}

// A total (scores' maximum `m`, sum of probabilities, outputs) with a
// block's sums folded in: the new maximum, and the factors the total's and
// the block's sums are scaled by (exp of their maximum less the new one).
struct Fold {
    top: f32,
    kept: f32,
    added: f32,
}

fn fold(m: f32, block_m: f32) -> Fold {
    let top = max(m, block_m);
    return Fold(top, exp(m - top), exp(block_m - top));
}
