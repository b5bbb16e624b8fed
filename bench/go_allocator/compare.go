// Comparison of one upstream AllocationResult with a case's expected result, by the rules of the
// case file's header (the same rules as tests/unit/operator/allocator/conformance_loader.py).
package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
)

// A UUID as the allocator writes it: canonical, lower case.
var canonicalUUID = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// expectedDevice is an expected result entry; shareID "<generated-uuid>" means "any fresh UUID".
type expectedDevice struct {
	result  resourceapi.DeviceRequestAllocationResult
	shareID string
}

func expectedDevices(raw []map[string]any) ([]expectedDevice, error) {
	out := make([]expectedDevice, 0, len(raw))
	for _, m := range raw {
		copied := map[string]any{}
		for k, v := range m {
			copied[k] = v
		}
		share, _ := copied["shareID"].(string)
		delete(copied, "shareID")
		var d expectedDevice
		if err := convert(copied, &d.result); err != nil {
			return nil, fmt.Errorf("expected device %v: %w", m, err)
		}
		d.shareID = share
		out = append(out, d)
	}
	return out, nil
}

func tolerationText(t resourceapi.DeviceToleration) string {
	op := t.Operator
	if op == "" {
		op = resourceapi.DeviceTolerationOpEqual
	}
	seconds := "-"
	if t.TolerationSeconds != nil {
		seconds = fmt.Sprint(*t.TolerationSeconds)
	}
	return strings.Join([]string{t.Key, string(op), t.Value, string(t.Effect), seconds}, "|")
}

func tolerationsText(ts []resourceapi.DeviceToleration) []string {
	out := []string{}
	for _, t := range ts {
		out = append(out, tolerationText(t))
	}
	return out
}

func sameStrings[S ~string](a, b []S) bool {
	return len(a) == len(b) && (len(a) == 0 || slices.Equal(a, b))
}

// deviceDiff says how the upstream device differs from the expected one ("" if it does not).
func deviceDiff(want expectedDevice, got resourceapi.DeviceRequestAllocationResult) string {
	w := want.result
	switch {
	case w.Request != got.Request || w.Driver != got.Driver || w.Pool != got.Pool || w.Device != got.Device:
		return "device"
	case (w.AdminAccess != nil && *w.AdminAccess) != (got.AdminAccess != nil && *got.AdminAccess):
		return "adminAccess"
	case !slices.Equal(tolerationsText(w.Tolerations), tolerationsText(got.Tolerations)):
		return "tolerations"
	case !sameStrings(w.BindingConditions, got.BindingConditions):
		return "bindingConditions"
	case !sameStrings(w.BindingFailureConditions, got.BindingFailureConditions):
		return "bindingFailureConditions"
	case !sameStrings(w.SkipNodeOperations, got.SkipNodeOperations):
		return "skipNodeOperations"
	}
	if why := shareIDDiff(want.shareID, got); why != "" {
		return why
	}
	if len(w.ConsumedCapacity) != len(got.ConsumedCapacity) {
		return "consumedCapacity"
	}
	for name, q := range w.ConsumedCapacity {
		g, ok := got.ConsumedCapacity[name]
		if !ok || q.Cmp(g) != 0 {
			return "consumedCapacity"
		}
	}
	return ""
}

func shareIDDiff(want string, got resourceapi.DeviceRequestAllocationResult) string {
	if want == "" {
		if got.ShareID != nil {
			return "shareID (none expected)"
		}
		return ""
	}
	if got.ShareID == nil {
		return "shareID (none given)"
	}
	text := string(*got.ShareID)
	if !canonicalUUID.MatchString(text) {
		return fmt.Sprintf("shareID %q is not a canonical UUID", text)
	}
	return ""
}

// devicesDiff compares in order (match: exact) or as a multiset.
func devicesDiff(want []expectedDevice, got []resourceapi.DeviceRequestAllocationResult, exact bool) string {
	if len(want) != len(got) {
		return fmt.Sprintf("%d devices, the case expects %d", len(got), len(want))
	}
	if exact {
		for i := range want {
			if why := deviceDiff(want[i], got[i]); why != "" {
				return fmt.Sprintf("device #%d differs in %s", i, why)
			}
		}
		return ""
	}
	used := make([]bool, len(got))
	for i, w := range want {
		found := false
		for j, g := range got {
			if !used[j] && deviceDiff(w, g) == "" {
				used[j], found = true, true
				break
			}
		}
		if !found {
			return fmt.Sprintf("expected device #%d (%s %s/%s/%s) not among upstream's", i,
				w.result.Request, w.result.Driver, w.result.Pool, w.result.Device)
		}
	}
	return ""
}

// generic round-trips through JSON so that two values compare as their JSON does.
func generic(v any) any {
	data, _ := json.Marshal(v)
	var out any
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.UseNumber()
	_ = dec.Decode(&out)
	return out
}

func requirementsText(reqs []v1.NodeSelectorRequirement) string {
	var out []string
	for _, r := range reqs {
		values := slices.Clone(r.Values)
		slices.Sort(values)
		out = append(out, fmt.Sprintf("%s %s %v", r.Key, r.Operator, values))
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// selectorText is a node selector with terms, requirements and values in a fixed order.
func selectorText(s *v1.NodeSelector) string {
	if s == nil {
		return "<none>"
	}
	var terms []string
	for _, t := range s.NodeSelectorTerms {
		terms = append(terms, "fields{"+requirementsText(t.MatchFields)+"} expressions{"+
			requirementsText(t.MatchExpressions)+"}")
	}
	slices.Sort(terms)
	return strings.Join(terms, " OR ")
}

func compareResult(want expectedResult, got resourceapi.AllocationResult) string {
	devices, err := expectedDevices(want.Devices)
	if err != nil {
		return err.Error()
	}
	if why := devicesDiff(devices, got.Devices.Results, want.Match == "exact"); why != "" {
		return why
	}
	wantConfig := generic(want.Config)
	if want.Config == nil {
		wantConfig = generic([]any{})
	}
	gotConfig := generic(got.Devices.Config)
	if got.Devices.Config == nil {
		gotConfig = generic([]any{})
	}
	if !reflect.DeepEqual(wantConfig, gotConfig) {
		return "config differs"
	}
	if w, g := selectorText(want.NodeSelector), selectorText(got.NodeSelector); w != g {
		return fmt.Sprintf("node selector %s, the case expects %s", g, w)
	}
	return ""
}
