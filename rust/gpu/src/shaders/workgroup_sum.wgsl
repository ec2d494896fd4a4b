// The sum of one value from each of a workgroup's 64 threads, on every
// thread: a tree, each pair WG / 2 apart first, then half as far. Pairs in
// different subgroups add in workgroup memory; pairs within one (closer
// than SHUFFLED_BELOW, from `kernels.rs`) through subgroup shuffles, which
// leave every lane of the subgroup the same bits: the same pairs in the
// same order either way. Call it from every thread of the workgroup with
// its place (`index_of`): it waits at barriers and shuffles.

const WG: u32 = 64u;
var<workgroup> partial: array<f32, select(WG, 1u, SHUFFLED_BELOW >= WG)>;

fn workgroup_sum(lid: u32, v: f32) -> f32 {
    var total = v;
    if (SHUFFLED_BELOW < WG) {
        partial[lid] = v;
        workgroupBarrier();
        for (var half = WG / 2u; half >= SHUFFLED_BELOW; half >>= 1u) {
            if (lid < half) {
                partial[lid] += partial[lid + half];
            }
            workgroupBarrier();
        }
        // Every subgroup takes the first SHUFFLED_BELOW sums, so that every
        // thread ends with the total.
        total = partial[lid % SHUFFLED_BELOW];
        // No thread may write `partial` again before every thread has read it.
        workgroupBarrier();
    }
    for (var half = min(WG, SHUFFLED_BELOW) / 2u; half > 0u; half >>= 1u) {
        total = add_across(total, half);
    }
    return total;
}
