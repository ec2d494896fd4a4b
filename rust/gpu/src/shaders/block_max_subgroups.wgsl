// The largest of the workgroup's 64 scores of each of its PAIRS (query,
// head) pairs, on every thread: each subgroup's own, then the largest of
// those, with one barrier where the tree took one a step. A maximum is the
// same in any order. Every thread calls it; `maxes` may be written again
// after the next barrier.

fn block_maxes(i: Invocation, s: array<f32, PAIRS>) -> array<f32, PAIRS> {
    for (var n = 0u; n < PAIRS; n++) {
        let own = subgroupMax(s[n]);
        if (i.lane == 0u) {
            maxes[n * WG + i.subgroup] = own;
        }
    }
    workgroupBarrier();
    var all: array<f32, PAIRS>;
    for (var n = 0u; n < PAIRS; n++) {
        all[n] = maxes[n * WG];
        for (var k = 1u; k < WG / i.size; k++) {
            all[n] = max(all[n], maxes[n * WG + k]);
        }
    }
    return all;
}
