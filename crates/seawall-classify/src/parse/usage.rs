//! Usage objects read through a [`View`] (a `serde_json::Value` or a stream event's bytes)
//! into core's [`ReportedUsage`], whose one rule turns them into a `Usage` for every layer.

use seawall_core::ReportedUsage;

use super::scan::View;

/// Reads a usage object (`None` for anything else, or an object without a count).
pub(super) fn from_view<'a, V: View<'a>>(v: V) -> Option<ReportedUsage> {
    if !v.is_object() {
        return None;
    }
    let count = |k: &str| v.get(k).and_then(V::as_u64);
    let nested = |k: &str, member: &str| v.get(k).and_then(|d| d.get(member)).and_then(V::as_u64);
    Some(ReportedUsage::from_members(count, nested)).filter(ReportedUsage::has_counts)
}
