package com.acme.http;

import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.StringJoiner;

/** Builds query strings from parameters, the inverse of {@link QueryString#parse}. */
public final class QueryBuilder {
    private QueryBuilder() {}

    public static String build(Map<String, List<String>> params) {
        StringJoiner joiner = new StringJoiner("&");
        for (Map.Entry<String, List<String>> e : params.entrySet()) {
            for (String v : e.getValue()) {
                joiner.add(encode(e.getKey()) + "=" + encode(v));
            }
        }
        return joiner.toString();
    }

    private static String encode(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8);
    }
}
