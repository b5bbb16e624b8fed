// The -conformance mode: every case of the project's allocator case file
// (tests/fixtures/conformance/allocator-cases.yaml, format in its header) run
// through the upstream allocator, with the case's feature gates, and its
// outcome compared with what the case expects.
//
// Per case the allocator is the one NewAllocator picks for the case's features
// among the variants the case lists (upstreamVariants), as kube-scheduler's
// DynamicResources plugin calls it; every other listed variant runs the case
// too, as upstream's own test table does. One line per case and variant.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

type caseFile struct {
	Cases []confCase `json:"cases"`
}

type confNode struct {
	Name             string            `json:"name"`
	Labels           map[string]string `json:"labels"`
	DeclaredFeatures []string          `json:"declaredFeatures"`
}

type confCase struct {
	Name                     string                                  `json:"name"`
	Features                 []string                                `json:"features"`
	UpstreamVariants         []string                                `json:"upstreamVariants"`
	Node                     *confNode                               `json:"node"`
	Classes                  []map[string]any                        `json:"classes"`
	Slices                   []map[string]any                        `json:"slices"`
	Claims                   []map[string]any                        `json:"claims"`
	AllocatedDevices         []string                                `json:"allocatedDevices"`
	AllocatedSharedDeviceIDs []string                                `json:"allocatedSharedDeviceIDs"`
	AllocatedCapacity        map[string]map[string]resource.Quantity `json:"allocatedCapacity"`
	AllocateOneInvocations   map[string]int64                        `json:"allocateOneInvocations"`
	Expect                   expectation                             `json:"expect"`
}

type expectation struct {
	Outcome       string           `json:"outcome"`
	Results       []expectedResult `json:"results"`
	ErrorContains string           `json:"errorContains"`
	ErrorKind     string           `json:"errorKind"`
}

type expectedResult struct {
	Match        string           `json:"match"`
	Devices      []map[string]any `json:"devices"`
	Config       []any            `json:"config"`
	NodeSelector *v1.NodeSelector `json:"nodeSelector"`
}

// verdict is one line of the report (JSON with -json).
type verdict struct {
	Case        string `json:"case"`
	Variant     string `json:"variant"`
	Scheduler   bool   `json:"scheduler"` // the variant NewAllocator picks for the case's gates
	Agree       bool   `json:"agree"`
	Why         string `json:"why,omitempty"`
	Outcome     string `json:"outcome"`
	Upstream    any    `json:"upstream,omitempty"` // results or error text, when they disagree
	Invocations int64  `json:"allocateOneInvocations"`
}

// featureFields maps each Features.Set() name (the case file's gate names) to its field.
func featureFields() map[string]int {
	out := map[string]int{}
	t := reflect.TypeOf(structured.Features{})
	for i := range t.NumField() {
		var f structured.Features
		reflect.ValueOf(&f).Elem().Field(i).SetBool(true)
		for name := range f.Set() {
			out[name] = i
		}
	}
	return out
}

func caseFeatures(names []string) (structured.Features, error) {
	fields := featureFields()
	var f structured.Features
	for _, name := range names {
		i, ok := fields[name]
		if !ok {
			return f, fmt.Errorf("unknown feature %q", name)
		}
		reflect.ValueOf(&f).Elem().Field(i).SetBool(true)
	}
	return f, nil
}

// listedClasses lists in the case's order and fails a lookup as an informer's lister does.
type listedClasses []*resourceapi.DeviceClass

func (l listedClasses) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

func (l listedClasses) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{}, "not found")
}

// celSelectors turns the file's {cel: "expr"} into v1's {cel: {expression: "expr"}}; any other
// selector stays an empty one (a selector of an unknown type).
func celSelectors(raw any) []any {
	list, _ := raw.([]any)
	out := make([]any, 0, len(list))
	for _, s := range list {
		m, _ := s.(map[string]any)
		if expr, ok := m["cel"]; ok {
			out = append(out, map[string]any{"cel": map[string]any{"expression": expr}})
		} else {
			out = append(out, map[string]any{})
		}
	}
	return out
}

func withSelectors(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	if s, ok := m["selectors"]; ok {
		out["selectors"] = celSelectors(s)
	}
	return out
}

// convert round-trips a generic value through JSON into a typed API object.
func convert(from any, into any) error {
	data, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(data, into)
}

func classesOf(c *confCase) (listedClasses, error) {
	var out listedClasses
	for _, raw := range c.Classes {
		spec := map[string]any{"selectors": celSelectors(raw["selectors"])}
		if cfg, ok := raw["config"]; ok {
			spec["config"] = cfg
		}
		class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(raw["name"])}}
		if err := convert(spec, &class.Spec); err != nil {
			return nil, fmt.Errorf("class %v: %w", raw["name"], err)
		}
		out = append(out, class)
	}
	return out, nil
}

func slicesOf(c *confCase) ([]*resourceapi.ResourceSlice, error) {
	var out []*resourceapi.ResourceSlice
	for _, raw := range c.Slices {
		spec := map[string]any{}
		for k, v := range raw {
			if k != "name" {
				spec[k] = v
			}
		}
		slice := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(raw["name"])}}
		if err := convert(spec, &slice.Spec); err != nil {
			return nil, fmt.Errorf("slice %v: %w", raw["name"], err)
		}
		out = append(out, slice)
	}
	return out, nil
}

func claimsOf(c *confCase) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, raw := range c.Claims {
		var requests []any
		list, _ := raw["requests"].([]any)
		for _, r := range list {
			m, _ := r.(map[string]any)
			req := map[string]any{"name": m["name"]}
			if exactly, ok := m["exactly"].(map[string]any); ok {
				req["exactly"] = withSelectors(exactly)
			}
			if subs, ok := m["firstAvailable"].([]any); ok {
				var converted []any
				for _, s := range subs {
					sm, _ := s.(map[string]any)
					converted = append(converted, withSelectors(sm))
				}
				req["firstAvailable"] = converted
			}
			requests = append(requests, req)
		}
		devices := map[string]any{"requests": requests}
		for _, k := range []string{"constraints", "config"} {
			if v, ok := raw[k]; ok && v != nil {
				devices[k] = v
			}
		}
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprint(raw["name"])}}
		if err := convert(devices, &claim.Spec.Devices); err != nil {
			return nil, fmt.Errorf("claim %v: %w", raw["name"], err)
		}
		out = append(out, claim)
	}
	return out, nil
}

func nodeOf(c *confCase) *v1.Node {
	n := c.Node
	if n == nil {
		n = &confNode{Name: "node-1", Labels: map[string]string{"region": "region-1", "planet": "earth"}}
	}
	return &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels},
		Status:     v1.NodeStatus{DeclaredFeatures: n.DeclaredFeatures},
	}
}

// deviceID parses "driver/pool/device"; a pool name may contain slashes.
func deviceID(text string) (structured.DeviceID, error) {
	driver, rest, ok := strings.Cut(text, "/")
	i := strings.LastIndex(rest, "/")
	if !ok || i <= 0 || i == len(rest)-1 || driver == "" {
		return structured.DeviceID{}, fmt.Errorf("invalid device ID %q", text)
	}
	return structured.MakeDeviceID(driver, rest[:i], rest[i+1:]), nil
}

func allocatedStateOf(c *confCase) (structured.AllocatedState, error) {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, text := range c.AllocatedDevices {
		id, err := deviceID(text)
		if err != nil {
			return state, err
		}
		state.AllocatedDevices.Insert(id)
	}
	for _, text := range c.AllocatedSharedDeviceIDs {
		i := strings.LastIndex(text, "/")
		id, err := deviceID(text[:max(i, 0)])
		if err != nil {
			return state, err
		}
		share := types.UID(text[i+1:])
		state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, &share))
	}
	for text, amounts := range c.AllocatedCapacity {
		id, err := deviceID(text)
		if err != nil {
			return state, err
		}
		consumed := map[resourceapi.QualifiedName]resource.Quantity{}
		for name, q := range amounts {
			consumed[resourceapi.QualifiedName(name)] = q
		}
		state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, consumed))
	}
	return state, nil
}

// caseInput is one case turned into the allocator's arguments (built afresh for every run: the
// allocator must not see what an earlier run may have changed).
type caseInput struct {
	features structured.Features
	state    structured.AllocatedState
	classes  listedClasses
	slices   []*resourceapi.ResourceSlice
	claims   []*resourceapi.ResourceClaim
	node     *v1.Node
}

func inputOf(c *confCase) (*caseInput, error) {
	in := &caseInput{node: nodeOf(c)}
	var err error
	if in.features, err = caseFeatures(c.Features); err != nil {
		return nil, err
	}
	if in.state, err = allocatedStateOf(c); err != nil {
		return nil, err
	}
	if in.classes, err = classesOf(c); err != nil {
		return nil, err
	}
	if in.slices, err = slicesOf(c); err != nil {
		return nil, err
	}
	if in.claims, err = claimsOf(c); err != nil {
		return nil, err
	}
	return in, nil
}

// variantName is "incubating" for *incubating.Allocator.
func variantName(a structured.Allocator) string {
	name := fmt.Sprintf("%T", a)
	name = strings.TrimPrefix(name, "*")
	before, _, _ := strings.Cut(name, ".")
	return before
}

// invocations reads the allocator's search-effort counter (GetStats returns an internal type).
func invocations(a structured.Allocator) int64 {
	m := reflect.ValueOf(a).MethodByName("GetStats")
	if !m.IsValid() {
		return -1
	}
	return m.Call(nil)[0].FieldByName("NumAllocateOneInvocations").Int()
}

// runCase allocates the case with the allocator NewAllocator picks among the given variants.
func runCase(c *confCase, variants []string) (v verdict, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	in, err := inputOf(c)
	if err != nil {
		return v, err
	}
	ctx := context.Background()
	structured.EnableAllocators(variants...)
	defer structured.EnableAllocators()
	// As upstream's test harness: a one-entry cache with the case's CEL features.
	celCache := cel.NewCache(1, cel.Features{
		EnableConsumableCapacity: in.features.ConsumableCapacity,
		EnableListTypeAttributes: in.features.ListTypeAttributes,
	})
	allocator, err := structured.NewAllocator(ctx, in.features, in.state, in.classes, in.slices, celCache)
	if err != nil {
		return v, err
	}
	v = verdict{Case: c.Name, Variant: variantName(allocator)}
	results, allocErr := allocator.Allocate(ctx, in.node, in.claims)
	v.Invocations = invocations(allocator)
	v.Outcome, v.Why, v.Upstream = judge(c, results, allocErr)
	if v.Why == "" {
		v.Why = checkInvocations(c, v.Variant, v.Invocations)
	}
	v.Agree = v.Why == ""
	if v.Agree {
		v.Upstream = nil
	}
	return v, nil
}

func checkInvocations(c *confCase, variant string, got int64) string {
	want, ok := c.AllocateOneInvocations[variant]
	if !ok {
		want, ok = c.AllocateOneInvocations["default"]
	}
	if !ok || got < 0 || got == want {
		return ""
	}
	return fmt.Sprintf("allocateOneInvocations: upstream %d, the case %d", got, want)
}

// judge compares upstream's outcome with the case's: the outcome upstream had, why they differ
// ("" when they agree) and, to show, what upstream returned.
func judge(c *confCase, results []resourceapi.AllocationResult, err error) (string, string, any) {
	want := c.Expect
	if err != nil {
		text := err.Error()
		switch {
		case want.Outcome != "error":
			return "error", fmt.Sprintf("upstream failed, the case expects %s", want.Outcome), text
		case !strings.Contains(text, want.ErrorContains):
			return "error", fmt.Sprintf("error text lacks %q", want.ErrorContains), text
		}
		nodeLocal := errors.Is(err, structured.ErrFailedAllocationOnNode)
		if nodeLocal != strings.HasPrefix(want.ErrorKind, "node-local") {
			return "error", fmt.Sprintf("node-local error is %v, the case says %q", nodeLocal, want.ErrorKind), text
		}
		return "error", "", text
	}
	if results == nil {
		if want.Outcome != "unallocatable" {
			return "unallocatable", fmt.Sprintf("upstream found no allocation, the case expects %s", want.Outcome), nil
		}
		return "unallocatable", "", nil
	}
	if want.Outcome != "allocated" {
		return "allocated", fmt.Sprintf("upstream allocated, the case expects %s", want.Outcome), results
	}
	if len(results) != len(want.Results) {
		return "allocated", fmt.Sprintf("%d results, the case expects %d", len(results), len(want.Results)), results
	}
	for i := range results {
		if why := compareResult(want.Results[i], results[i]); why != "" {
			return "allocated", fmt.Sprintf("claim #%d: %s", i, why), results
		}
	}
	return "allocated", "", results
}

// parseCases reads the YAML as YAML 1.2 does (as PyYAML reads this file: "Y" is a string, not
// YAML 1.1's true), then through JSON into the case types; numbers stay exact on the way.
func parseCases(data []byte) (*caseFile, error) {
	var tree any
	if err := yaml.Unmarshal(data, &tree); err != nil {
		return nil, err
	}
	text, err := json.Marshal(tree)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var file caseFile
	if err := dec.Decode(&file); err != nil {
		return nil, err
	}
	return &file, nil
}

func runConformance(path string, only string, asJSON bool, out io.Writer) (int, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	file, err := parseCases(data)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	disagreements := 0
	ran := 0
	for i := range file.Cases {
		c := &file.Cases[i]
		if only != "" && c.Name != only {
			continue
		}
		ran++
		for _, v := range caseVerdicts(c) {
			if !v.Agree {
				disagreements++
			}
			printVerdict(out, v, asJSON)
		}
	}
	if ran == 0 {
		return 0, fmt.Errorf("no case named %q in %s", only, path)
	}
	return disagreements, nil
}

// caseVerdicts runs the case with the scheduler's choice first, then every other listed variant.
func caseVerdicts(c *confCase) []verdict {
	failed := func(variant string, err error) verdict {
		return verdict{Case: c.Name, Variant: variant, Why: "could not run: " + err.Error(), Outcome: "not run"}
	}
	first, err := runCase(c, c.UpstreamVariants)
	if err != nil {
		return []verdict{failed(strings.Join(c.UpstreamVariants, ","), err)}
	}
	first.Scheduler = true
	out := []verdict{first}
	for _, variant := range c.UpstreamVariants {
		if variant == first.Variant {
			continue
		}
		v, err := runCase(c, []string{variant})
		if err != nil {
			v = failed(variant, err)
		} else if v.Variant != variant {
			v.Agree, v.Why = false, fmt.Sprintf("asked for %s, NewAllocator gave %s", variant, v.Variant)
		}
		out = append(out, v)
	}
	return out
}

func printVerdict(out io.Writer, v verdict, asJSON bool) {
	if asJSON {
		line, _ := json.Marshal(v)
		fmt.Fprintln(out, string(line))
		return
	}
	mark := "agree   "
	if !v.Agree {
		mark = "DISAGREE"
	}
	who := v.Variant
	if v.Scheduler {
		who += "*"
	}
	fmt.Fprintf(out, "%s %-14s %-13s %s\n", mark, who, v.Outcome, v.Case)
	if !v.Agree {
		detail, _ := json.Marshal(v.Upstream)
		fmt.Fprintf(out, "         %s\n         upstream: %s\n", v.Why, detail)
	}
}
