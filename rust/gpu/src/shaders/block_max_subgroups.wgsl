// The largest of the workgroup's 64 scores of head h (of the workgroup's
// GROUP), on every thread: each subgroup's own, then the largest of those,
// with one barrier where the tree took one a step. A maximum is the same in
// any order. Every thread calls it; head h's part of `maxes` may be written
// again after the next barrier.

fn block_max(i: Invocation, s: f32, h: u32) -> f32 {
    let at = h * WG;
    let own = subgroupMax(s);
    if (i.lane == 0u) {
        maxes[at + i.subgroup] = own;
    }
    workgroupBarrier();
    var all = maxes[at];
    for (var k = 1u; k < WG / i.size; k++) {
        all = max(all, maxes[at + k]);
    }
    return all;
}
