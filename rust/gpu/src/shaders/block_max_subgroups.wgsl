// The largest of the workgroup's 64 scores, on every thread: each
// subgroup's own, then the largest of those, with one barrier where the
// tree took one a step. A maximum is the same in any order. Every thread
// calls it; `maxes` may be written again after the next barrier.

fn block_max(i: Invocation, s: f32) -> f32 {
    let own = subgroupMax(s);
    if (i.lane == 0u) {
        maxes[i.subgroup] = own;
    }
    workgroupBarrier();
    var all = maxes[0];
    for (var k = 1u; k < WG / i.size; k++) {
        all = max(all, maxes[k]);
    }
    return all;
}
