// The largest of the workgroup's 64 scores of each of its PAIRS (query,
// head) pairs, on every thread, by one tree in workgroup memory (pair n's
// from n * WG of `maxes`). Every thread calls it (it waits at barriers);
// `maxes` may be written again after the next barrier.

fn block_maxes(i: Invocation, s: array<f32, PAIRS>) -> array<f32, PAIRS> {
    let lid = index_of(i);
    for (var n = 0u; n < PAIRS; n++) {
        maxes[n * WG + lid] = s[n];
    }
    workgroupBarrier();
    for (var half = WG / 2u; half > 0u; half >>= 1u) {
        if (lid < half) {
            for (var n = 0u; n < PAIRS; n++) {
                maxes[n * WG + lid] = max(maxes[n * WG + lid], maxes[n * WG + lid + half]);
            }
        }
        workgroupBarrier();
    }
    var all: array<f32, PAIRS>;
    for (var n = 0u; n < PAIRS; n++) {
        all[n] = maxes[n * WG];
    }
    return all;
}
