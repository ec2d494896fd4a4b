// The largest of the workgroup's 64 scores, on every thread, by a tree in
// workgroup memory. Every thread calls it (it waits at barriers); `maxes`
// may be written again after the next barrier.

fn block_max(i: Invocation, s: f32) -> f32 {
    let lid = index_of(i);
    maxes[lid] = s;
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            maxes[lid] = max(maxes[lid], maxes[lid + half]);
        }
        workgroupBarrier();
    }
    return maxes[0];
}
