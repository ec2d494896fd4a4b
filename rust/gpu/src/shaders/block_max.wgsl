// The largest of the workgroup's 64 scores of head h (of the workgroup's
// GROUP), on every thread, by a tree in workgroup memory (head h's part of
// `maxes`). Every thread calls it (it waits at barriers); head h's part of
// `maxes` may be written again after the next barrier.

fn block_max(i: Invocation, s: f32, h: u32) -> f32 {
    let lid = index_of(i);
    let at = h * WG;
    maxes[at + lid] = s;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            maxes[at + lid] = max(maxes[at + lid], maxes[at + lid + half]);
        }
        workgroupBarrier();
    }
    return maxes[at];
}
