// Command go_allocator places claims with the upstream structured allocator
// (k8s.io/dynamic-resource-allocation at the pinned Kubernetes version) the way
// kube-scheduler's DynamicResources plugin drives it, and prints JSON figures.
//
// With -conformance FILE it runs the project's allocator cases instead (conformance.go).
//
// Input: the JSON that bench/allocator_side_by_side.py writes: nodes (names, in
// order), deviceClasses, resourceSlices and, per mix, the claims to place.
//
// Per claim, as the plugin does per pod: PreFilter gathers the allocated state
// (a fresh copy of the allocated devices) and calls NewAllocator once with the
// features of the 1.37 default gates; Filter calls Allocate(node, claim) per
// node. Nodes are tried in order and the first node with a result wins (first
// fit, one goroutine); its devices count as allocated for the following claims.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

// features are AllocatorFeatures(fts) of kube-scheduler 1.37 with its default
// gates: DRAConsumableCapacity is beta (on), DRAListTypeAttributes is alpha
// (off), DRAFractionalCapacityRange is beta but off, as are the new alpha gates.
// With these NewAllocator picks the "incubating" implementation.
var features = structured.Features{
	AdminAccess:            true,
	PrioritizedList:        true,
	PartitionableDevices:   true,
	DeviceTaints:           true,
	DeviceBindingAndStatus: true,
	ConsumableCapacity:     true,
}

type input struct {
	Nodes          []string                                `json:"nodes"`
	DeviceClasses  []*resourceapi.DeviceClass              `json:"deviceClasses"`
	ResourceSlices []*resourceapi.ResourceSlice            `json:"resourceSlices"`
	Mixes          map[string][]*resourceapi.ResourceClaim `json:"mixes"`
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("deviceclass %q not found", name)
}

type figures struct {
	Mix            string   `json:"mix"`
	Claims         int      `json:"claims"`
	Allocated      int      `json:"allocated"`
	Failed         int      `json:"failed"`
	TotalS         float64  `json:"total_s"`
	CPUS           float64  `json:"cpu_s"`
	ClaimsPerS     float64  `json:"claims_per_s"`
	P50Ms          float64  `json:"p50_ms"`
	P99Ms          float64  `json:"p99_ms"`
	AllocateCalls  int      `json:"allocate_calls"`
	AllocateMeanUs float64  `json:"allocate_mean_us"`
	AllocateHitUs  float64  `json:"allocate_hit_mean_us"`
	AllocateMissUs float64  `json:"allocate_miss_mean_us"`
	NewAllocatorUs float64  `json:"new_allocator_mean_us"`
	ParseS         float64  `json:"parse_s"`
	Allocator      string   `json:"allocator"`
	Placements     []string `json:"placements,omitempty"`
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func percentile(sorted []time.Duration, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := min(len(sorted)-1, int(q*float64(len(sorted))))
	return float64(sorted[i]) / float64(time.Millisecond)
}

// setDefaults fills in what the API server's defaulting would have set on a stored
// claim and the allocator relies on: allocationMode ExactCount, count 1.
func setDefaults(claim *resourceapi.ResourceClaim) {
	defaultCount := func(mode *resourceapi.DeviceAllocationMode, count *int64) {
		if *mode == "" {
			*mode = resourceapi.DeviceAllocationModeExactCount
		}
		if *mode == resourceapi.DeviceAllocationModeExactCount && *count == 0 {
			*count = 1
		}
	}
	for i := range claim.Spec.Devices.Requests {
		r := &claim.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			defaultCount(&r.Exactly.AllocationMode, &r.Exactly.Count)
		}
		for j := range r.FirstAvailable {
			defaultCount(&r.FirstAvailable[j].AllocationMode, &r.FirstAvailable[j].Count)
		}
	}
}

// placement is "node pool/device,..." for a placed claim.
func placement(node string, result resourceapi.AllocationResult) string {
	var devices []string
	for _, r := range result.Devices.Results {
		devices = append(devices, r.Pool+"/"+r.Device)
	}
	return node + " " + strings.Join(devices, ",")
}

func run(in *input, mix string, withPlacements bool) (*figures, error) {
	claims, ok := in.Mixes[mix]
	if !ok {
		return nil, fmt.Errorf("no mix %q in the input", mix)
	}
	for _, claim := range claims {
		setDefaults(claim)
	}
	ctx := context.Background()
	classes := classLister{}
	for _, c := range in.DeviceClasses {
		classes[c.Name] = c
	}
	nodes := make([]*v1.Node, len(in.Nodes))
	for i, name := range in.Nodes {
		nodes[i] = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	// The plugin's cache: 10 compiled expressions, shared across scheduling cycles.
	celCache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity})
	allocated := sets.New[structured.DeviceID]()

	f := &figures{Mix: mix, Claims: len(claims)}
	type placedAt struct {
		node   string
		result resourceapi.AllocationResult
	}
	where := map[int]placedAt{} // claim index -> where it went, with -placements
	latencies := make([]time.Duration, 0, len(claims))
	var allocateTime, hitTime, newAllocatorTime time.Duration
	cpu0 := cpuSeconds()
	t0 := time.Now()
	for _, claim := range claims {
		start := time.Now()
		// PreFilter: the allocated state is a fresh copy each time (claimTracker.GatherAllocatedState).
		state := structured.AllocatedState{
			AllocatedDevices:         allocated.Clone(),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		}
		allocator, err := structured.NewAllocator(ctx, features, state, classes, in.ResourceSlices, celCache)
		if err != nil {
			return nil, err
		}
		newAllocatorTime += time.Since(start)
		if f.Allocator == "" {
			f.Allocator = fmt.Sprintf("%T", allocator)
		}
		// Filter, node after node; the first result wins.
		placed := -1
		for i, node := range nodes {
			s := time.Now()
			results, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			took := time.Since(s)
			allocateTime += took
			f.AllocateCalls++
			if err != nil {
				return nil, fmt.Errorf("claim %s on node %s: %w", claim.Name, node.Name, err)
			}
			if results == nil {
				continue
			}
			hitTime += took
			for _, r := range results[0].Devices.Results {
				if r.AdminAccess == nil || !*r.AdminAccess {
					allocated.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
				}
			}
			placed = i
			if withPlacements {
				where[len(latencies)] = placedAt{node.Name, results[0]}
			}
			break
		}
		latencies = append(latencies, time.Since(start))
		if placed < 0 {
			f.Failed++
		} else {
			f.Allocated++
		}
	}
	total := time.Since(t0)
	f.CPUS = cpuSeconds() - cpu0
	f.TotalS = total.Seconds()
	if total > 0 {
		f.ClaimsPerS = float64(len(claims)) / total.Seconds()
	}
	if withPlacements {
		for i := range claims {
			if w, ok := where[i]; ok {
				f.Placements = append(f.Placements, placement(w.node, w.result))
			} else {
				f.Placements = append(f.Placements, "-")
			}
		}
	}
	slices.Sort(latencies)
	f.P50Ms = percentile(latencies, 0.5)
	f.P99Ms = percentile(latencies, 0.99)
	if f.AllocateCalls > 0 {
		f.AllocateMeanUs = float64(allocateTime) / float64(f.AllocateCalls) / float64(time.Microsecond)
	}
	if f.Allocated > 0 {
		f.AllocateHitUs = float64(hitTime) / float64(f.Allocated) / float64(time.Microsecond)
	}
	if misses := f.AllocateCalls - f.Allocated; misses > 0 {
		f.AllocateMissUs = float64(allocateTime-hitTime) / float64(misses) / float64(time.Microsecond)
	}
	if len(claims) > 0 {
		f.NewAllocatorUs = float64(newAllocatorTime) / float64(len(claims)) / float64(time.Microsecond)
	}
	return f, nil
}

func main() {
	path := flag.String("input", "", "the cluster and claims JSON written by bench/allocator_side_by_side.py")
	mix := flag.String("mix", "", "which mix of the input to place")
	withPlacements := flag.Bool("placements", false, "also print where each claim went")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the placement to this file")
	cases := flag.String("conformance", "", "run every case of this allocator case file (YAML) and compare")
	only := flag.String("case", "", "with -conformance: only the case of this name")
	asJSON := flag.Bool("json", false, "with -conformance: one JSON object per case and variant")
	flag.Parse()
	if *cases != "" {
		disagreements, err := runConformance(*cases, *only, *asJSON, os.Stdout)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if disagreements > 0 {
			fmt.Fprintf(os.Stderr, "%d disagreement(s) with upstream\n", disagreements)
			os.Exit(1)
		}
		return
	}
	if *path == "" || *mix == "" {
		fmt.Fprintln(os.Stderr, "usage: go_allocator -input FILE -mix NAME [-placements] [-cpuprofile FILE]\n"+
			"       go_allocator -conformance CASES.yaml [-case NAME] [-json]")
		os.Exit(2)
	}
	started := time.Now()
	data, err := os.ReadFile(*path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var in input
	if err := json.Unmarshal(data, &in); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", *path, err)
		os.Exit(1)
	}
	parse := time.Since(started)
	if *cpuProfile != "" {
		out, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer pprof.StopCPUProfile()
	}
	f, err := run(&in, *mix, *withPlacements)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	f.ParseS = parse.Seconds()
	out, _ := json.Marshal(f)
	fmt.Println(string(out))
}
