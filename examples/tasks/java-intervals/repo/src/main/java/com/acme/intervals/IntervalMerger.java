package com.acme.intervals;

import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;

/** Merges overlapping or touching intervals. */
public final class IntervalMerger {
    private IntervalMerger() {}

    /** Returns the union of {@code input} as sorted, disjoint intervals; the input is not modified. */
    public static List<Interval> merge(List<Interval> input) {
        List<Interval> sorted = new ArrayList<>(input);
        sorted.sort(Comparator.comparingInt(Interval::start));
        List<Interval> out = new ArrayList<>();
        for (Interval cur : sorted) {
            if (!out.isEmpty() && cur.start() <= out.get(out.size() - 1).end()) {
                Interval last = out.remove(out.size() - 1);
                out.add(new Interval(last.start(), cur.end()));
            } else {
                out.add(cur);
            }
        }
        return out;
    }

    /** Total length covered by the intervals, counting overlaps once. */
    public static int coveredLength(List<Interval> input) {
        int total = 0;
        for (Interval i : merge(input)) {
            total += i.length();
        }
        return total;
    }
}
